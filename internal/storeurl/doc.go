// Package storeurl opens an oncekit driver from a URL, the one form
// oncectl, the inventory example and the integration tests share:
//
//	memory://                                  the in-process driver (this process only)
//	redis://[user:password@]host:port[/db]     one Redis server (rediss:// for TLS)
//	redis-cluster://host:port,host:port,...    a Redis Cluster
//	redlock://host:port,host:port,host:port    Redlock over N independent Redis servers
//	etcd://host:port,host:port,...             an etcd cluster
//
// Query parameters: prefix=P (the lock key prefix), record_prefix=P (the
// idempotency record prefix), and for TLS: ca=FILE (PEM certificates to
// trust; it turns TLS on for redis-cluster://, redlock:// and etcd://),
// cert=FILE and key=FILE (a client certificate). Credentials go in the
// URL's user part: user:password@ (a Redis ACL user, or password alone
// for requirepass; an etcd user).
package storeurl
