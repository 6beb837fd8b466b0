package sqlstore

// NowUS is the statements' reading of the server's clock, for tests.
var NowUS = nowUS
