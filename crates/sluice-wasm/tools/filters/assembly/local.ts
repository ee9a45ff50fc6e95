// Answers requests itself: 403 with a body and a header, unless the request has `x-pass: yes`.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context, send_local_response, GrpcStatusValues, HeaderPair, Headers } from "@solo-io/proxy-runtime";

class LocalRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Local(context_id, this);
  }
}

class Local extends Context {
  constructor(context_id: u32, root_context: LocalRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    if (stream_context.headers.request.get("x-pass") == "yes") {
      return FilterHeadersStatusValues.Continue;
    }
    let headers: Headers = [];
    headers.push(new HeaderPair(String.UTF8.encode("x-wasm-local"), String.UTF8.encode("1")));
    send_local_response(403, "denied", String.UTF8.encode("denied by wasm: " + this.root_context.getConfiguration() + "\n"), headers, GrpcStatusValues.Ok);
    return FilterHeadersStatusValues.StopIteration;
  }
}

registerRootContext((context_id: u32) => { return new LocalRoot(context_id); }, "wasm_local");
