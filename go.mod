module github.com/oncekit/oncekit

go 1.26

require go.uber.org/goleak v1.3.0 // indirect
