// Adds a header to the request going upstream and to the response: `x-wasm-req` / `x-wasm: <conf>`, and
// `x-wasm-served: N`, the number of requests this instance has served (1 on an instance's first request, so a
// host that reuses instances shows higher numbers). Refuses the configuration "reject" (proxy_on_configure
// returns false).
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context } from "@solo-io/proxy-runtime";

class AddHeaderRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new AddHeader(context_id, this);
  }
  onConfigure(configuration_size: u32): bool {
    super.onConfigure(configuration_size);
    return this.getConfiguration() != "reject";
  }
}

let served: u32 = 0;

class AddHeader extends Context {
  seq: u32 = 0;
  constructor(context_id: u32, root_context: AddHeaderRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    served++;
    this.seq = served;
    stream_context.headers.request.add("x-wasm-req", this.root_context.getConfiguration());
    return FilterHeadersStatusValues.Continue;
  }
  onResponseHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    stream_context.headers.response.add("x-wasm", this.root_context.getConfiguration());
    stream_context.headers.response.add("x-wasm-served", this.seq.toString());
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new AddHeaderRoot(context_id); }, "wasm_add_header");
