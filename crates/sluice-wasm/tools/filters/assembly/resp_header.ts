// docs/wasm.md's example and the cost benchmark's filter: adds one response header, `x-wasm: <conf>`.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context } from "@solo-io/proxy-runtime";

class RespHeaderRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new RespHeader(context_id, this);
  }
}

class RespHeader extends Context {
  constructor(context_id: u32, root_context: RespHeaderRoot) {
    super(context_id, root_context);
  }
  onResponseHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    stream_context.headers.response.add("x-wasm", this.root_context.getConfiguration());
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new RespHeaderRoot(context_id); }, "wasm_resp_header");
