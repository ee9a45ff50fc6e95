// Asks a service before letting a request through: the configuration is `host:port` (GET /check) or
// `host:port/path`; the call carries the request's `x-token`. A 200 answer resumes the request with `x-checked: <answer body>`; any other answer is given
// to the client as is (status and body); no answer at all gives 503.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context, send_local_response, continue_request, GrpcStatusValues, HeaderPair, Headers } from "@solo-io/proxy-runtime";
import { get_buffer_bytes, BufferTypeValues } from "@solo-io/proxy-runtime/runtime";

function h(k: string, v: string): HeaderPair {
  return new HeaderPair(String.UTF8.encode(k), String.UTF8.encode(v));
}

class CalloutRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Callout(context_id, this);
  }
}

function answered(origin: Context, headers: u32, body_size: usize, trailers: u32): void {
  if (headers == 0) {
    send_local_response(503, "call failed", String.UTF8.encode("check service unreachable\n"), [], GrpcStatusValues.Ok);
    return;
  }
  let status = stream_context.headers.http_callback.get(":status");
  let body = String.UTF8.decode(get_buffer_bytes(BufferTypeValues.HttpCallResponseBody, 0, body_size as u32));
  if (status == "200") {
    stream_context.headers.request.add("x-checked", body);
    continue_request();
  } else {
    send_local_response(U32.parseInt(status), "denied", String.UTF8.encode(body), [], GrpcStatusValues.Ok);
  }
}

class Callout extends Context {
  constructor(context_id: u32, root_context: CalloutRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let headers: Headers = [];
    headers.push(h(":method", "GET"));
    let conf = this.root_context.getConfiguration();
    let slash = conf.indexOf("/");
    let upstream = slash < 0 ? conf : conf.substring(0, slash);
    let path = slash < 0 ? "/check" : conf.substring(slash);
    headers.push(h(":path", path));
    headers.push(h(":authority", "checker"));
    headers.push(h("x-token", stream_context.headers.request.get("x-token")));
    this.root_context.httpCall(upstream, headers, new ArrayBuffer(0), [], 2000, this, answered);
    return FilterHeadersStatusValues.StopIteration;
  }
}

registerRootContext((context_id: u32) => { return new CalloutRoot(context_id); }, "wasm_callout");
