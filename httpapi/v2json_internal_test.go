package httpapi

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/oip"
)

// stdInferJSON is the JSON body of an answer with JSON data as
// encoding/json writes it from maps of Go values: what writeInferJSON
// wrote before it wrote by hand, kept as the reference it must match.
func stdInferJSON(h *inferHeader, name, version string, outs []oip.Cut) ([]byte, []byte, error) {
	resp := map[string]any{"model_name": name, "model_version": version, "outputs": nil}
	if h.id != "" {
		resp["id"] = h.id
	}
	var tail []byte
	outList := make([]map[string]any, 0, len(outs))
	for i := range outs {
		o, decl := &outs[i], outs[i].Decl
		t := map[string]any{"name": decl.Name, "datatype": decl.Datatype, "shape": o.Shape}
		if h.binaryOutput || h.wantsBinary(decl.Name) {
			t["parameters"] = map[string]any{"binary_data_size": len(o.Bytes)}
			tail = append(tail, o.Bytes...)
		} else {
			t["data"] = decodeElements(decl.Datatype, o.Bytes)
		}
		outList = append(outList, t)
	}
	resp["outputs"] = outList
	js, err := json.Marshal(resp)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the response: %v", err)
	}
	return js, tail, nil
}

// decodeElements is the JSON data of a little-endian tensor (flat).
func decodeElements(dt string, b []byte) []any {
	es := int(abi.DatatypeSize[dt])
	out := make([]any, 0, len(b)/es)
	for i := 0; i+es <= len(b); i += es {
		e := b[i : i+es]
		var v any
		switch dt {
		case "BOOL":
			v = e[0] != 0
		case "UINT8":
			v = e[0]
		case "INT8":
			v = int8(e[0])
		case "UINT16":
			v = binary.LittleEndian.Uint16(e)
		case "INT16":
			v = int16(binary.LittleEndian.Uint16(e))
		case "UINT32":
			v = binary.LittleEndian.Uint32(e)
		case "INT32":
			v = int32(binary.LittleEndian.Uint32(e))
		case "UINT64":
			v = binary.LittleEndian.Uint64(e)
		case "INT64":
			v = int64(binary.LittleEndian.Uint64(e))
		case "FP32":
			v = math.Float32frombits(binary.LittleEndian.Uint32(e))
		case "FP64":
			v = math.Float64frombits(binary.LittleEndian.Uint64(e))
		case "FP16":
			v = float16to32(binary.LittleEndian.Uint16(e))
		}
		out = append(out, v)
	}
	return out
}

func strconvItoa(n int) string { return fmt.Sprint(n) }

// statusOf is err's HTTP status, as v2Run answers it (0: no apierr).
func statusOf(err error) int {
	if e, ok := err.(*apierr.Error); ok {
		return e.Status.HTTP
	}
	return 0
}
