package httpmw

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
)

// recorder passes the handler's response through to the client and keeps
// a copy: the status, the allowed headers as they were when the header was
// written, and the body up to a limit. A handler that flushes a stream or
// hijacks the connection makes the response unstorable.
type recorder struct {
	http.ResponseWriter
	allowed  map[string]bool
	limit    int
	status   int
	fields   []string // the allowed headers when the header was written: name, value, …
	fieldBuf [8]string
	body     bytes.Buffer
	overflow bool // the body passed limit
	streamed bool // Flush was called
	hijacked bool
	final    bool // the handler called Final

	// Commit: the response is held back until its effect and record are
	// committed, then written (or replaced by an error).
	runCtx   context.Context
	buffered bool
	held     bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
		r.fields = r.fieldBuf[:0]
		for k, vs := range r.ResponseWriter.Header() {
			if k = http.CanonicalHeaderKey(k); r.allowed[k] {
				for _, v := range vs {
					r.fields = append(r.fields, k, v)
				}
			}
		}
	}
	if !r.buffered {
		r.ResponseWriter.WriteHeader(code)
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.overflow {
		if r.body.Len()+len(p) > r.limit {
			r.overflow = true
			r.body = bytes.Buffer{}
		} else {
			r.body.Write(p)
		}
	}
	if r.buffered {
		return r.held.Write(p)
	}
	return r.ResponseWriter.Write(p)
}

// release writes a held response to the client.
func (r *recorder) release() {
	r.ResponseWriter.WriteHeader(r.status)
	_, _ = r.ResponseWriter.Write(r.held.Bytes())
}

// Flush marks the response as a stream, which is not stored.
func (r *recorder) Flush() {
	_ = r.FlushError()
}

// FlushError is what http.ResponseController calls. A held response
// (Commit) is not flushed: it goes out once committed.
func (r *recorder) FlushError() error {
	if r.buffered {
		return nil
	}
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	r.streamed = true
	return http.NewResponseController(r.ResponseWriter).Flush()
}

// Hijack marks the response as taken over, which is not stored.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	r.hijacked = true
	return http.NewResponseController(r.ResponseWriter).Hijack()
}

// Unwrap lets http.ResponseController reach the other features of the
// underlying writer (deadlines, full duplex).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
