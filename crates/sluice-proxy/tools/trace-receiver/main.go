// A trace backend for Sluice's tests: it receives OTLP/HTTP protobuf (POST /v1/traces, decoded by the
// OpenTelemetry Collector's pdata) and Zipkin v2 JSON (POST /api/v2/spans, decoded by zipkin-go's model), keeps
// every span in memory and answers GET /api/traces?service=NAME with them as JSON. Loopback only.
//
// Built instead of Jaeger all-in-one: a cold `go build` of Jaeger v1.76.0 had not finished after 7m50s on the
// shared 2-core build machine (this one builds cold in about 2 minutes there).
package main

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/openzipkin/zipkin-go/model"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

// Span is what a query returns, whichever protocol brought it.
type Span struct {
	Protocol     string            `json:"protocol"`
	Service      string            `json:"service"`
	TraceID      string            `json:"traceId"`
	SpanID       string            `json:"spanId"`
	ParentSpanID string            `json:"parentSpanId"`
	TraceState   string            `json:"traceState"`
	Name         string            `json:"name"`
	Kind         string            `json:"kind"`
	StartNs      uint64            `json:"startNs"`
	EndNs        uint64            `json:"endNs"`
	Attributes   map[string]any    `json:"attributes"`
	Resource     map[string]any    `json:"resource"`
	Scope        string            `json:"scope"`
	StatusCode   string            `json:"statusCode"`
	StatusMsg    string            `json:"statusMessage"`
	Endpoint     map[string]string `json:"localEndpoint,omitempty"`
}

type store struct {
	mu    sync.Mutex
	spans []Span
	posts int
}

func (s *store) add(spans []Span) {
	s.mu.Lock()
	s.spans = append(s.spans, spans...)
	s.posts++
	s.mu.Unlock()
}

func attrs(m pcommon.Map) map[string]any {
	out := map[string]any{}
	m.Range(func(k string, v pcommon.Value) bool {
		out[k] = v.AsRaw()
		return true
	})
	return out
}

func (s *store) otlp(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content-type "+ct, 415)
		return
	}
	req := ptraceotlp.NewExportRequest()
	if err := req.UnmarshalProto(body); err != nil {
		http.Error(w, "bad protobuf: "+err.Error(), 400)
		return
	}
	var got []Span
	rss := req.Traces().ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		res := attrs(rs.Resource().Attributes())
		service, _ := res["service.name"].(string)
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j)
			spans := ss.Spans()
			for k := 0; k < spans.Len(); k++ {
				sp := spans.At(k)
				parent := ""
				if !sp.ParentSpanID().IsEmpty() {
					parent = sp.ParentSpanID().String()
				}
				got = append(got, Span{
					Protocol: "otlp", Service: service,
					TraceID: sp.TraceID().String(), SpanID: sp.SpanID().String(), ParentSpanID: parent,
					TraceState: sp.TraceState().AsRaw(), Name: sp.Name(), Kind: sp.Kind().String(),
					StartNs: uint64(sp.StartTimestamp()), EndNs: uint64(sp.EndTimestamp()),
					Attributes: attrs(sp.Attributes()), Resource: res, Scope: ss.Scope().Name(),
					StatusCode: sp.Status().Code().String(), StatusMsg: sp.Status().Message(),
				})
			}
		}
	}
	s.add(got)
	resp, _ := ptraceotlp.NewExportResponse().MarshalProto()
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(resp)
}

func (s *store) zipkin(w http.ResponseWriter, r *http.Request) {
	var spans []model.SpanModel
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&spans); err != nil {
		http.Error(w, "bad zipkin json: "+err.Error(), 400)
		return
	}
	var got []Span
	for _, sp := range spans {
		parent := ""
		if sp.ParentID != nil {
			parent = sp.ParentID.String()
		}
		service := ""
		ep := map[string]string{}
		if sp.LocalEndpoint != nil {
			service = sp.LocalEndpoint.ServiceName
			ep["serviceName"] = service
			ep["ipv4"] = sp.LocalEndpoint.IPv4.String()
			ep["port"] = fmt.Sprint(sp.LocalEndpoint.Port)
		}
		tags := map[string]any{}
		for k, v := range sp.Tags {
			tags[k] = v
		}
		start := uint64(sp.Timestamp.UnixNano())
		tid := sp.TraceID.String()
		if sp.TraceID.High == 0 {
			// zipkin-go prints a 64-bit trace id in 16 digits; keep 32 so both protocols compare alike.
			var b [16]byte
			h := sp.TraceID
			for i := 0; i < 8; i++ {
				b[15-i] = byte(h.Low >> (8 * i))
			}
			tid = hex.EncodeToString(b[:])
		}
		got = append(got, Span{
			Protocol: "zipkin", Service: service, TraceID: tid, SpanID: sp.ID.String(),
			ParentSpanID: parent, Name: sp.Name, Kind: string(sp.Kind), StartNs: start,
			EndNs: start + uint64(sp.Duration.Nanoseconds()), Attributes: tags, Endpoint: ep,
		})
	}
	s.add(got)
	w.WriteHeader(202)
}

func (s *store) query(w http.ResponseWriter, r *http.Request) {
	service := r.URL.Query().Get("service")
	s.mu.Lock()
	out := []Span{}
	for _, sp := range s.spans {
		if service == "" || sp.Service == service {
			out = append(out, sp)
		}
	}
	posts := s.posts
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"data": out, "posts": posts})
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	flag.Parse()
	// The test holds our stdin: when it goes away (however it ends), so do we.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	s := &store{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", s.otlp)
	mux.HandleFunc("POST /api/v2/spans", s.zipkin)
	mux.HandleFunc("GET /api/traces", s.query)
	// The test reads the port from the first line.
	fmt.Fprintf(os.Stdout, "listening %s\n", l.Addr())
	os.Stdout.Sync()
	log.Fatal(http.Serve(l, mux))
}
