module github.com/oncekit/oncekit/kafkamw/kafkamwtest

go 1.26.0

replace github.com/oncekit/oncekit => ../..

require (
	github.com/oncekit/oncekit v0.0.0-00010101000000-000000000000
	github.com/segmentio/kafka-go v0.4.51
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
)
