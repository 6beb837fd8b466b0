package grpcmw

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FuzzDecodeOutcome: any stored bytes decode to a reply, a status, or
// errCorrupt — never a panic — and a decoded outcome encodes to bytes
// that decode to the same outcome.
func FuzzDecodeOutcome(f *testing.F) {
	reply, _ := encodeReply(durationpb.New(1500))
	f.Add(reply)
	st, _ := status.New(codes.FailedPrecondition, "sold out").WithDetails(&errdetails.ErrorInfo{Reason: "sold_out"})
	stored, _ := encodeStatus(st)
	f.Add(stored)
	f.Add([]byte{recordVersion})
	f.Add([]byte{recordVersion, kindReply, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{recordVersion, kindReply, 3, 'a', '.', 'b'})
	f.Add([]byte{recordVersion, kindStatus, 0x08, 0x09})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, runErr, err := decodeOutcome(b)
		if err != nil {
			return
		}
		var again []byte
		if m != nil {
			again, err = encodeReply(m)
		} else {
			again, err = encodeStatus(status.Convert(runErr))
		}
		if err != nil {
			t.Fatalf("a decoded outcome does not encode: %v", err)
		}
		m2, runErr2, err := decodeOutcome(again)
		if err != nil || (m != nil) != (m2 != nil) || (m != nil && !proto.Equal(m, m2)) ||
			status.Code(runErr) != status.Code(runErr2) {
			t.Fatalf("re-encoding changed the outcome: %v", err)
		}
	})
}
