// Package otelobs reports oncekit's events (package core/observe) as
// OpenTelemetry spans: one span per lock, idempotency or middleware
// operation, with the fence, the outcome and the replay flag as attributes
// and keys only ever hashed.
//
//	tracing := otelobs.New(otelobs.WithTracerProvider(tp))
//	store, _ := redisstore.New(client, redisstore.WithObserver(tracing))
//
// Combine it with metrics or logging with observe.Multi.
package otelobs
