// Loops forever on requests with `x-loop: 1`; lets the others through.
export * from "@solo-io/proxy-runtime/proxy";
import { RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context } from "@solo-io/proxy-runtime";

let spins: u64 = 0;

class LoopRoot extends RootContext {
  createContext(context_id: u32): Context {
    return new Loop(context_id, this);
  }
}

class Loop extends Context {
  constructor(context_id: u32, root_context: LoopRoot) {
    super(context_id, root_context);
  }
  onRequestHeaders(a: u32, end_of_stream: bool): FilterHeadersStatusValues {
    if (stream_context.headers.request.get("x-loop") == "1") {
      while (true) {
        spins++;
      }
    }
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32) => { return new LoopRoot(context_id); }, "wasm_loop");
