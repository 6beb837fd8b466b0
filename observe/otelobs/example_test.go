package otelobs_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/observe/otelobs"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Spans for every claim, under the caller's span; here recorded in memory
// (use your exporter's TracerProvider, or none for the global one).
func Example() {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer tp.Shutdown(context.Background())

	store := memstore.New(memstore.WithObserver(otelobs.New(otelobs.WithTracerProvider(tp))))
	guard, err := idem.NewGuard(store)
	if err != nil {
		panic(err)
	}
	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /orders")
	for range 2 {
		_, _, _ = guard.Do(ctx, "order-1", "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	}
	span.End()
	for _, s := range recorder.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == otelobs.AttrOutcome {
				fmt.Println(s.Name(), a.Value.AsString())
			}
		}
	}
	// Output:
	// idem.begin acquired
	// idem.complete stored
	// idem.begin replayed
}
