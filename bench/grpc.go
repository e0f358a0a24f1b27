package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/oip"
)

// grpcTarget is a run's gRPC side: the address, the credentials and the
// request every worker sends (the input split into the model's declared
// inputs, raw, as invoke's body lays them out).
type grpcTarget struct {
	cfg   *Config
	addr  string
	creds grpc.DialOption
	req   *pb.ModelInferRequest
}

// newGRPCTarget reads the model's metadata once and builds the request.
func newGRPCTarget(ctx context.Context, cfg *Config) (*grpcTarget, error) {
	u, err := url.Parse(cfg.GRPC)
	if err != nil || u.Host == "" || (u.Scheme != "grpc" && u.Scheme != "grpcs") {
		return nil, fmt.Errorf("bench: gRPC address %q: want grpc://host:port or grpcs://host:port", cfg.GRPC)
	}
	g := &grpcTarget{cfg: cfg, addr: u.Host, creds: grpc.WithTransportCredentials(insecure.NewCredentials())}
	if u.Scheme == "grpcs" {
		tc := cfg.TLS
		if tc == nil {
			tc = &tls.Config{}
		}
		g.creds = grpc.WithTransportCredentials(credentials.NewTLS(tc))
	}
	conn, err := grpc.NewClient(g.addr, g.creds)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", cfg.GRPC, err)
	}
	defer conn.Close()
	mctx, cancel := context.WithTimeout(g.context(ctx), cfg.Timeout)
	defer cancel()
	md, err := pb.NewGRPCInferenceServiceClient(conn).ModelMetadata(mctx, &pb.ModelMetadataRequest{Name: cfg.Function})
	if err != nil {
		return nil, fmt.Errorf("no response from %s: ModelMetadata %s: %w", cfg.GRPC, cfg.Function, err)
	}
	g.req, err = splitInput(cfg.Function, cfg.Input, md.GetInputs())
	return g, err
}

// splitInput cuts input into the model's declared inputs, as the engine
// reads its input buffer (oip.Split): fixed sizes first, a variable
// dimension (the last input's) taking what is left.
func splitInput(model string, input []byte, meta []*pb.ModelMetadataResponse_TensorMetadata) (*pb.ModelInferRequest, error) {
	decl := make([]abi.Tensor, len(meta))
	for i, d := range meta {
		if _, ok := abi.DatatypeSize[d.GetDatatype()]; !ok {
			return nil, fmt.Errorf("bench: input %q: datatype %s cannot be sent raw", d.GetName(), d.GetDatatype())
		}
		decl[i] = abi.Tensor{Name: d.GetName(), Datatype: d.GetDatatype(), Shape: d.GetShape()}
	}
	cuts, _, err := oip.Split(input, decl, nil, nil, "input")
	if err != nil {
		return nil, fmt.Errorf("bench: the --in/--size bytes as the model's inputs: %w", err)
	}
	req := &pb.ModelInferRequest{ModelName: model}
	used := 0
	for _, c := range cuts {
		req.Inputs = append(req.Inputs, &pb.ModelInferRequest_InferInputTensor{Name: c.Decl.Name, Datatype: c.Decl.Datatype, Shape: c.Shape})
		req.RawInputContents = append(req.RawInputContents, c.Bytes)
		used += len(c.Bytes)
	}
	if used < len(input) {
		return nil, fmt.Errorf("bench: %d bytes of the input after the model's inputs", len(input)-used)
	}
	return req, nil
}

func (g *grpcTarget) context(ctx context.Context) context.Context {
	if g.cfg.Token != "" {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.cfg.Token)
	}
	return ctx
}

// sender is one worker's connection.
func (g *grpcTarget) sender() (*grpcSender, error) {
	conn, err := grpc.NewClient(g.addr, g.creds,
		// As the server: fixed windows, no bandwidth probing pings.
		grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		return nil, err
	}
	return &grpcSender{g: g, conn: conn, client: pb.NewGRPCInferenceServiceClient(conn)}, nil
}

type grpcSender struct {
	g      *grpcTarget
	conn   *grpc.ClientConn
	client pb.GRPCInferenceServiceClient
	hdr    metadata.MD
	rep    reply
}

// send ignores the run's context, as the HTTP sender does: a request
// sent is answered or times out, and is counted once either way.
func (s *grpcSender) send(context.Context) (*reply, error) {
	ctx, cancel := context.WithTimeout(s.g.context(context.Background()), s.g.cfg.Timeout)
	defer cancel()
	s.hdr = nil
	var p peer.Peer
	resp, err := s.client.ModelInfer(ctx, s.g.req, grpc.Header(&s.hdr), grpc.Peer(&p))
	s.rep = reply{}
	if err != nil {
		st, ok := status.FromError(err)
		// No connection (no server), or this client's own timeout: a
		// transport error, as fasthttp reports them, not the server's.
		if !ok || p.Addr == nil || ctx.Err() != nil {
			return nil, err
		}
		s.rep.code, s.rep.errMsg = apierr.HTTPOf(st.Code()), st.Code().String()+": "+st.Message()
		return &s.rep, nil
	}
	s.rep.code = 200
	if v := s.hdr.Get("x-plover-start"); len(v) > 0 {
		s.rep.start = []byte(v[0])
	}
	if v := s.hdr.Get("server-timing"); len(v) > 0 {
		s.rep.timing = []byte(v[0])
	}
	if raw := resp.GetRawOutputContents(); len(raw) > 0 {
		s.rep.body = raw[0]
		if len(raw) > 1 {
			for _, b := range raw[1:] {
				s.rep.body = append(s.rep.body[:len(s.rep.body):len(s.rep.body)], b...)
			}
		}
	}
	return &s.rep, nil
}

func (s *grpcSender) close() { s.conn.Close() }
