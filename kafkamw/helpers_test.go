package kafkamw_test

import "github.com/oncekit/oncekit/kafkamw/internal/kafkatest"

// The helpers the tests share with the client adapters' (kafkatest).
var (
	newRedisStore = kafkatest.NewRedisStore
	eachStore     = kafkatest.EachStore
	newGuard      = kafkatest.NewGuard
	newReader     = kafkatest.NewReader
	newWriter     = kafkatest.NewWriter
	message       = kafkatest.Message
	messages      = kafkatest.Messages
	produce       = kafkatest.Produce
	newEffects    = kafkatest.NewEffects
	idOf          = kafkatest.IDOf
	waitFor       = kafkatest.WaitFor
	committed     = kafkatest.Committed
	ends          = kafkatest.Ends
	allCommitted  = kafkatest.AllCommitted
	run           = kafkatest.Run
	deadLetter    = kafkatest.DeadLetter
)
