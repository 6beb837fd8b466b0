package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// BenchmarkStockHotItem: many buyers take one unit each of one hot item,
// from 16 "processes" (each its own Store and connection pool) of 8
// buyers each, against what a team writes by hand: on SQL the
// conditional UPDATE … SET stock = stock - 1 WHERE … AND stock >= 1 (one
// statement, autocommit), on Redis a script that checks and DECRBYs.
// oncekit's take also records each buyer's key (a retry gets the first
// answer) and merges the concurrent takes of one process into one store
// call; the hand-written ones do neither. takes/s counts answered takes.
//
//	go test -run '^$' -bench StockHotItem -benchtime 20000x ./bench
func BenchmarkStockHotItem(b *testing.B) {
	const processes, buyers = 16, 8
	dbs := sqlDatabases(b)
	for _, name := range []string{"postgres", "mysql"} {
		url := dbs[name]
		b.Run(name+"/oncekit-stock", func(b *testing.B) {
			stocks := make([]*stock.Stock, processes)
			for i := range stocks {
				stocks[i] = mustStock(b, sqlStore(b, url))
			}
			takeBench(b, stocks, processes*buyers)
		})
		b.Run(name+"/hand-written-update", func(b *testing.B) {
			admin := sqlStore(b, url)
			item := benchKey("hot")
			if _, err := admin.DB().Exec("CREATE TABLE IF NOT EXISTS bench_hot_item (sku VARCHAR(128) PRIMARY KEY, stock BIGINT NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			if _, err := admin.DB().Exec(admin.Dialect().Rebind("INSERT INTO bench_hot_item (sku, stock) VALUES (?, ?)"), item, int64(1)<<40); err != nil {
				b.Fatal(err)
			}
			dbs := make([]*sql.DB, processes)
			for i := range dbs {
				dbs[i] = sqlStore(b, url).DB()
			}
			q := admin.Dialect().Rebind("UPDATE bench_hot_item SET stock = stock - ? WHERE sku = ? AND stock >= ?")
			parallelTakes(b, processes*buyers, func(ctx context.Context, p, _ int) error {
				res, err := dbs[p%processes].ExecContext(ctx, q, 1, item, 1)
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					return errors.New("sold out")
				}
				return nil
			})
		})
	}
	addr := testenv.RedisAddrs(b, 1)[0]
	b.Run("redis/oncekit-stock", func(b *testing.B) {
		stocks := make([]*stock.Stock, processes)
		for i := range stocks {
			c, _ := client(b, addr)
			s, err := redisstore.New(c)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			stocks[i] = mustStock(b, s)
		}
		defer redisCPU(b, addr)()
		takeBench(b, stocks, processes*buyers)
	})
	b.Run("redis/hand-written-decrby", func(b *testing.B) {
		item := benchKey("hot")
		cs := make([]*redis.Client, processes)
		for i := range cs {
			cs[i], _ = client(b, addr)
		}
		if err := cs[0].Set(context.Background(), item, int64(1)<<40, time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		take := redis.NewScript(`if tonumber(redis.call('GET', KEYS[1])) >= tonumber(ARGV[1]) then return redis.call('DECRBY', KEYS[1], ARGV[1]) end return -1`)
		defer redisCPU(b, addr)()
		parallelTakes(b, processes*buyers, func(ctx context.Context, p, _ int) error {
			n, err := take.Run(ctx, cs[p%processes], []string{item}, 1).Int64()
			if err == nil && n < 0 {
				err = errors.New("sold out")
			}
			return err
		})
	})
}

// redisCPU reports the Redis server's CPU time per take (µs, user and
// system, from INFO cpu) between its call and that of the function it
// returns: what bounds the takes when the server, not the clients, is
// the busy part (here the buyers share two cores with it).
func redisCPU(b *testing.B, addr string) func() {
	c, _ := client(b, addr)
	used := func() float64 {
		info, err := c.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_sys" || k == "used_cpu_user" {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return total
	}
	before := used()
	return func() { b.ReportMetric((used()-before)*1e6/float64(b.N), "server-µs/take") }
}

func mustStock(b *testing.B, store any) *stock.Stock {
	st, err := stock.New(store)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// takeBench takes one unit per iteration through the processes' Stocks
// (worker w uses Stock w % len), each with a key of its own.
func takeBench(b *testing.B, stocks []*stock.Stock, workers int) {
	item := benchKey("hot")
	if _, err := stocks[0].Put(context.Background(), item, 1<<40); err != nil {
		b.Fatal(err)
	}
	parallelTakes(b, workers, func(ctx context.Context, p, i int) error {
		_, err := stocks[p%len(stocks)].Take(ctx, item, fmt.Sprintf("k-%d-%d", p, i), 1)
		return err
	})
}

// parallelTakes runs b.N calls of take over workers goroutines (worker p
// makes its i-th) and reports takes/s.
func parallelTakes(b *testing.B, workers int, take func(ctx context.Context, p, i int) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	b.ResetTimer()
	start := time.Now()
	for p := range workers {
		wg.Go(func() {
			for i := 0; next.Add(1) <= int64(b.N); i++ {
				if err := take(ctx, p, i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "takes/s")
}

var _ = sqlstore.Postgres
