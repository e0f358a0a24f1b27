package httpapi

// The Open Inference Protocol's model repository extension (Triton's):
// POST /v2/repository/index, /v2/repository/models/{name}/load and
// /unload, over the Repository plover serve --repository serves. Index
// needs read, load and unload admin (see required).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/api"
)

// Repository is a model repository served on this node
// (repository.Repository).
type Repository interface {
	// Index lists its models' versions and their states (only READY ones
	// when ready is set).
	Index(ctx context.Context, ready bool) []api.RepositoryModel
	// Load deploys a model's folder as it is now; Unload stops serving it
	// until a load (requests in flight finish).
	Load(ctx context.Context, name string) error
	Unload(ctx context.Context, name string) error
}

var (
	pathRepository       = []byte("/v2/repository/")
	pathRepositoryModels = []byte("/v2/repository/models/")
)

// repositoryAction splits /v2/repository/models/{name}/{load|unload}:
// the name (the path's bytes, borrowed) and the action, or ok false.
func repositoryAction(path []byte) (name []byte, action string, ok bool) {
	rest, found := bytes.CutPrefix(path, pathRepositoryModels)
	if !found {
		return nil, "", false
	}
	name, act, found := bytes.Cut(rest, []byte{'/'})
	if !found || len(name) == 0 || (string(act) != "load" && string(act) != "unload") {
		return nil, "", false
	}
	return name, string(act), true
}

// repository routes /v2/repository/...: every route is a POST, as the
// extension has it.
func (s *Server) repository(ctx *fasthttp.RequestCtx) {
	if s.opts.Repository == nil {
		v2Error(ctx, fasthttp.StatusNotFound, "this server serves no model repository (plover serve --repository DIR)")
		return
	}
	path := ctx.Path()
	name, action, ok := repositoryAction(path)
	if string(path) != "/v2/repository/index" && !ok {
		v2Error(ctx, fasthttp.StatusNotFound, "no route for "+string(path))
		return
	}
	if !s.method(ctx, fasthttp.MethodPost) {
		return
	}
	// Index takes {"ready": bool}; load and unload take Triton's
	// {"parameters": {...}}, of which Plover uses none.
	var body struct {
		Ready          bool                       `json:"ready"`
		RepositoryName string                     `json:"repository_name"`
		Parameters     map[string]json.RawMessage `json:"parameters"`
	}
	b, held, err := s.readBody(ctx, bodyLimit{n: 64 << 10, why: "for this route"}, nil, turns{})
	if err != nil {
		s.fail(ctx, err)
		return
	}
	s.releaseBody(held) // parsed below: the bytes are done with
	if len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &body); err != nil {
			v2Error(ctx, fasthttp.StatusBadRequest, `body must be empty or a JSON object ({"ready": true} for the index): `+bodyReason(err))
			return
		}
	}
	repo := s.opts.Repository
	switch action {
	case "":
		writeJSON(ctx, fasthttp.StatusOK, s.index(ctx, repo, body.Ready))
		return
	case "load":
		if p := override(body.Parameters); p != "" {
			v2Error(ctx, fasthttp.StatusBadRequest, "load "+string(name)+": parameter "+strconv.Quote(p)+
				": a load deploys the model's folder as it is, and takes no configuration or files with the request (write them into the folder)")
			return
		}
		err = repo.Load(callCtx(ctx), string(name)) // string: a copy, as the repository keeps names
	case "unload":
		err = repo.Unload(callCtx(ctx), string(name))
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK) // the extension's success: 200, no body
}

// bodyReason says what is wrong with a JSON body (a repository route's,
// an inference header) in the client's terms (the field, what it is, what
// it should be), not in encoding/json's, which names this package's Go
// types.
func bodyReason(err error) string {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		if strings.HasPrefix(msg, "unknown field ") { // valid JSON, a field this route does not take
			return "has an " + msg
		}
		return "invalid JSON: " + msg
	}
	is := "is " + article(shown(te.Value)) // "number 1000...": a number as long as the body
	if te.Field == "" {
		return "it " + is + ", want a JSON object"
	}
	want := "a string"
	switch te.Type.Kind() {
	case reflect.Bool:
		want = "true or false"
	case reflect.Map, reflect.Struct:
		want = "a JSON object"
	case reflect.Slice:
		want = "an array"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "an integer"
	}
	return `"` + te.Field + `" ` + is + ", want " + want
}

// article is a JSON value's kind as encoding/json names it ("array",
// "number", ...) with its article.
func article(kind string) string {
	if kind == "array" || kind == "object" {
		return "an " + kind
	}
	return "a " + kind
}

// override is the first of a load's parameters that would change what
// loads (Triton's "config", a model configuration, and "file:PATH", a
// file's new content), or "": Plover has neither, and a load that
// answered 200 without them would tell the client its model was loaded
// as it asked.
func override(params map[string]json.RawMessage) string {
	keys := slices.Sorted(maps.Keys(params))
	for _, k := range keys {
		if k == "config" || strings.HasPrefix(k, "file:") {
			return k
		}
	}
	return ""
}
