package grpcmw

import (
	"encoding/binary"
	"errors"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// A stored call outcome is a version byte, a kind byte, then for a reply
// the message's full type name (uvarint length) and its bytes, or for a
// final error the google.rpc.Status with its details.
const (
	recordVersion = 1
	kindReply     = 1
	kindStatus    = 2
)

var errCorrupt = errors.New("not a stored gRPC outcome")

func encodeReply(m proto.Message) ([]byte, error) {
	name := string(m.ProtoReflect().Descriptor().FullName())
	// One allocation: the header, then the reply marshalled in place.
	out := make([]byte, 0, 2+binary.MaxVarintLen64+len(name)+proto.Size(m))
	out = append(out, recordVersion, kindReply)
	out = binary.AppendUvarint(out, uint64(len(name)))
	out = append(out, name...)
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(out, m)
}

func encodeStatus(st *status.Status) ([]byte, error) {
	b, err := proto.Marshal(st.Proto())
	if err != nil {
		return nil, err
	}
	return append([]byte{recordVersion, kindStatus}, b...), nil
}

// decodeOutcome returns the stored reply, or the stored final error as a
// status error.
func decodeOutcome(b []byte) (proto.Message, error, error) {
	if len(b) < 2 || b[0] != recordVersion {
		return nil, nil, errCorrupt
	}
	switch b[1] {
	case kindReply:
		n, k := binary.Uvarint(b[2:])
		if k <= 0 || uint64(len(b)-2-k) < n {
			return nil, nil, errCorrupt
		}
		name := protoreflect.FullName(b[2+k : 2+k+int(n)])
		mt, err := protoregistry.GlobalTypes.FindMessageByName(name)
		if err != nil {
			return nil, nil, errCorrupt
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(b[2+k+int(n):], m); err != nil {
			return nil, nil, errCorrupt
		}
		return m, nil, nil
	case kindStatus:
		var sp spb.Status
		if err := proto.Unmarshal(b[2:], &sp); err != nil {
			return nil, nil, errCorrupt
		}
		return nil, status.FromProto(&sp).Err(), nil
	}
	return nil, nil, errCorrupt
}
