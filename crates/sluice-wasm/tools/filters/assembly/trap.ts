// Traps (wasm `unreachable`) on requests with `x-trap: 1`; lets the others through.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context } from "@solo-io/proxy-runtime";

class TrapRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Trap(context_id, this);
  }
}

class Trap extends Context {
  constructor(context_id: u32, root_context: TrapRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    if (stream_context.headers.request.get("x-trap") == "1") {
      unreachable();
    }
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new TrapRoot(context_id); }, "wasm_trap");
