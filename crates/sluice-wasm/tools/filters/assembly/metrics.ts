// Defines a counter, a gauge and a histogram (`wasm_test.requests`, `wasm_test.last_status`,
// `wasm_test.body_bytes`) and updates them on every response: +1, the status, the upstream's Content-Length.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context, Counter, Gauge, Histogram } from "@solo-io/proxy-runtime";

let requests: Counter | null = null;
let lastStatus: Gauge | null = null;
let bodyBytes: Histogram | null = null;

class MetricsRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Metrics(context_id, this);
  }
  onConfigure(configuration_size: u32): bool {
    super.onConfigure(configuration_size);
    requests = new Counter("wasm_test.requests");
    lastStatus = new Gauge("wasm_test.last_status");
    bodyBytes = new Histogram("wasm_test.body_bytes");
    return true;
  }
}

class Metrics extends Context {
  constructor(context_id: u32, root_context: MetricsRoot) {
    super(context_id, root_context);
  }
  onResponseHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    (requests as Counter).increment(1);
    let g = lastStatus as Gauge;
    g.record(g.metric_id, U64.parseInt(stream_context.headers.response.get(":status")));
    let h = bodyBytes as Histogram;
    let len = stream_context.headers.response.get("content-length");
    h.record(h.metric_id, len == "" ? 0 : U64.parseInt(len));
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new MetricsRoot(context_id); }, "wasm_metrics");
