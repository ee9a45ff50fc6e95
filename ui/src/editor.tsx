// CodeMirror 6 editor for a resource as JSON or YAML, kept in sync with the form: a valid edit updates the value; a
// value changed elsewhere (the form) replaces the text unless it already means the same.
import { useEffect, useRef } from "react";
import { EditorView, basicSetup } from "codemirror";
import { EditorState } from "@codemirror/state";
import { json } from "@codemirror/lang-json";
import { yaml } from "@codemirror/lang-yaml";
import YAML from "yaml";

export type Lang = "json" | "yaml";

export function toText(v: unknown, lang: Lang): string {
  if (lang === "yaml") return YAML.stringify(v ?? {});
  return JSON.stringify(v ?? {}, null, 2);
}

export function fromText(t: string, lang: Lang): unknown {
  return lang === "yaml" ? YAML.parse(t) : JSON.parse(t);
}

export function CodeEditor(props: {
  value: unknown;
  lang: Lang;
  readOnly?: boolean;
  onChange?: (v: unknown) => void;
  onError?: (e: string | null) => void;
  testId?: string;
}) {
  const host = useRef<HTMLDivElement>(null);
  const view = useRef<EditorView | null>(null);
  const cb = useRef(props);
  cb.current = props;

  useEffect(() => {
    // Inside a shadow root CodeMirror styles itself with a constructed stylesheet (adoptedStyleSheets); in the
    // document it would add <style> tags, which the page's CSP (style-src 'self') refuses.
    const h = host.current!;
    const shadow = h.shadowRoot ?? h.attachShadow({ mode: "open" });
    shadow.replaceChildren();
    const mount = document.createElement("div");
    mount.className = "cm-host";
    shadow.appendChild(mount);
    const v = new EditorView({
      parent: mount,
      root: shadow,
      state: EditorState.create({
        doc: toText(props.value, props.lang),
        extensions: [
          basicSetup,
          EditorView.theme({ "&": { maxHeight: "75vh", fontSize: "12.5px" }, ".cm-scroller": { overflow: "auto" } }),
          props.lang === "yaml" ? yaml() : json(),
          EditorState.readOnly.of(!!props.readOnly),
          EditorView.updateListener.of((u) => {
            if (!u.docChanged) return;
            const text = u.state.doc.toString();
            try {
              const parsed = fromText(text, cb.current.lang);
              cb.current.onError?.(null);
              cb.current.onChange?.(parsed);
            } catch (e) {
              cb.current.onError?.(String((e as Error).message ?? e));
            }
          }),
        ],
      }),
    });
    view.current = v;
    return () => v.destroy();
    // Rebuilt only for a language or mode switch; value changes go through the effect below (keeps the cursor).
  }, [props.lang, props.readOnly]);

  useEffect(() => {
    const v = view.current;
    if (!v) return;
    const text = v.state.doc.toString();
    let same = false;
    try {
      same = JSON.stringify(fromText(text, props.lang)) === JSON.stringify(props.value ?? {});
    } catch {
      same = false;
    }
    if (!same) {
      v.dispatch({ changes: { from: 0, to: v.state.doc.length, insert: toText(props.value, props.lang) } });
    }
  }, [props.value, props.lang]);

  return <div className="editor" ref={host} data-testid={props.testId} />;
}
