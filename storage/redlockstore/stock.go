package redlockstore

import "errors"

// ErrNoStock is StockRefusal's error: Redlock keeps no stock.
var ErrNoStock = errors.New("redlockstore: Redlock keeps no stock: " +
	"a count kept on a majority of independent servers is not one count " +
	"(two takes can each reach a different majority, and a node that restarts empty forgets its part), " +
	"so units could be sold twice; keep the stock on one Redis deployment (redisstore: one server, Sentinel or Cluster) " +
	"or in SQL, beside Redlock's locks and records")

// StockRefusal implements stock.Refuser: stock.New refuses a Redlock
// Store with ErrNoStock, which says why and what to use instead.
func (s *Store) StockRefusal() error { return ErrNoStock }
