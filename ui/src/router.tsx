// Path routing under /ui/ with the History API: the gateway answers every app path with index.html (SPA fallback),
// so deep links work. Small enough that a router library would be mostly unused.
import { useEffect, useState } from "react";

const BASE = "/ui";

export function currentPath(): string {
  const p = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : location.pathname;
  return p || "/";
}

export function navigate(to: string) {
  history.pushState(null, "", BASE + to);
  window.dispatchEvent(new Event("sluice:navigate"));
}

export function usePath(): string {
  const [path, setPath] = useState(currentPath());
  useEffect(() => {
    const on = () => setPath(currentPath());
    window.addEventListener("popstate", on);
    window.addEventListener("sluice:navigate", on);
    return () => {
      window.removeEventListener("popstate", on);
      window.removeEventListener("sluice:navigate", on);
    };
  }, []);
  return path;
}

export function Link(props: { to: string; className?: string; children: React.ReactNode; testId?: string }) {
  return (
    <a
      href={BASE + props.to}
      className={props.className}
      data-testid={props.testId}
      onClick={(e) => {
        if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
        e.preventDefault();
        navigate(props.to);
      }}
    >
      {props.children}
    </a>
  );
}
