// Rewrites the upstream's response body: it asks for the body in its response headers phase (APISIX's
// `wasm_process_resp_body`), buffers it (StopIterationAndBuffer) until the end of the stream, then replaces
// "hello" with the configuration and appends "[wasm saw N bytes]" (N: the buffered length at the end), and sets
// `x-wasm-body: rewritten` from the body phase. Request headers choose other behaviours for the tests:
// - `x-mode: stream`: Continue on every piece (the next call sees only new data); at the end it appends
//   "[wasm streamed N bytes in C calls]" (N: the sum of the lengths it was handed);
// - `x-mode: grow`: sets a body of `x-size` bytes (over max_body_size in the tests);
// - `x-mode: local-body` / `local-headers`: answers 418 itself from the body / response headers phase;
// - `x-mode: off`: does not ask for the body (it streams past the filter).
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, FilterDataStatusValues, stream_context, send_local_response, GrpcStatusValues, HeaderPair, Headers } from "@solo-io/proxy-runtime";
import { get_buffer_bytes, set_property, BufferTypeValues } from "@solo-io/proxy-runtime/runtime";

// The SDK (0.1.8) declares no working setter for buffers: the ABI's own import.
// @ts-ignore: decorator
@external("env", "proxy_set_buffer_bytes")
declare function proxy_set_buffer_bytes(typ: i32, start: u32, length: u32, data: usize, size: usize): u32;

function setBody(start: u32, length: u32, text: string): u32 {
  let b = String.UTF8.encode(text);
  return proxy_set_buffer_bytes(BufferTypeValues.HttpResponseBody, start, length, changetype<usize>(b), b.byteLength);
}

function local(): void {
  let headers: Headers = [];
  headers.push(new HeaderPair(String.UTF8.encode("x-wasm-local"), String.UTF8.encode("response phase")));
  send_local_response(418, "teapot", String.UTF8.encode("replaced by wasm\n"), headers, GrpcStatusValues.Ok);
}

class BodyRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Body(context_id, this);
  }
}

class Body extends Context {
  mode: string = "";
  streamed: usize = 0;
  calls: u32 = 0;
  constructor(context_id: u32, root_context: BodyRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    this.mode = stream_context.headers.request.get("x-mode");
    return FilterHeadersStatusValues.Continue;
  }
  onResponseHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    if (this.mode == "local-headers") {
      local();
      return FilterHeadersStatusValues.StopIteration;
    }
    if (this.mode != "off") {
      set_property("wasm_process_resp_body", String.UTF8.encode("true"));
    }
    return FilterHeadersStatusValues.Continue;
  }
  onResponseBody(body_buffer_length: usize, end_of_stream: bool): FilterDataStatusValues {
    this.calls++;
    if (this.mode == "local-body") {
      local();
      return FilterDataStatusValues.StopIterationNoBuffer;
    }
    if (this.mode == "stream") {
      this.streamed += body_buffer_length;
      if (end_of_stream) {
        setBody(<u32>body_buffer_length, 0, "[wasm streamed " + this.streamed.toString() + " bytes in " + this.calls.toString() + " calls]\n");
      }
      return FilterDataStatusValues.Continue;
    }
    if (!end_of_stream) {
      return FilterDataStatusValues.StopIterationAndBuffer;
    }
    if (this.mode == "grow") {
      let n = I32.parseInt(stream_context.headers.request.get("x-size"));
      setBody(0, <u32>body_buffer_length, "x".repeat(n));
      return FilterDataStatusValues.Continue;
    }
    let body = String.UTF8.decode(get_buffer_bytes(BufferTypeValues.HttpResponseBody, 0, <u32>body_buffer_length));
    let out = body.replaceAll("hello", this.root_context.getConfiguration()) + "[wasm saw " + body_buffer_length.toString() + " bytes]\n";
    setBody(0, <u32>body_buffer_length, out);
    stream_context.headers.response.add("x-wasm-body", "rewritten");
    return FilterDataStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new BodyRoot(context_id); }, "wasm_body");
