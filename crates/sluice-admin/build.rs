//! Picks the dashboard's files to embed: the built UI (`ui/dist`, from `make ui`) when it is there, else a one-page
//! placeholder saying how to build it, so a plain `cargo build` works without node.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

const PLACEHOLDER: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Sluice dashboard: not built</title></head>
<body>
<h1>Sluice dashboard</h1>
<p>This binary was built without the dashboard's front end (<code>ui/dist</code> was absent).</p>
<p>Build it with <code>make ui</code> (Node.js 20+ and npm: <code>cd ui &amp;&amp; npm ci &amp;&amp; npm run build</code>),
then rebuild Sluice (<code>make build</code> or <code>cargo build -p sluice</code>).</p>
<p>The Admin API itself is served at <code>/apisix/admin/</code> (docs/admin-api.md, docs/dashboard.md).</p>
</body>
</html>
"#;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let ui = manifest.join("../../ui");
    let dist = ui.join("dist");
    let dir = if dist.join("index.html").is_file() {
        println!("cargo:rerun-if-changed={}", dist.display());
        println!("cargo:rustc-env=SLUICE_UI_BUILT=1");
        dist.canonicalize().expect("canonical ui/dist")
    } else {
        // Watching ui/ notices when `make ui` creates dist/ (a missing path would rerun this script every build).
        if ui.is_dir() {
            println!(
                "cargo:rerun-if-changed={}",
                ui.join("package.json").display()
            );
            println!("cargo:rerun-if-changed={}", ui.display());
        }
        println!("cargo:rustc-env=SLUICE_UI_BUILT=0");
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ui-placeholder");
        std::fs::create_dir_all(&out).expect("create placeholder dir");
        std::fs::write(out.join("index.html"), PLACEHOLDER).expect("write placeholder");
        out
    };
    // A fingerprint of the listing: a changed set of files changes this env var, so the crate (whose derive
    // lists the folder) is compiled again.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    stamp(&dir, &mut h);
    println!("cargo:rustc-env=SLUICE_UI_DIR={}", dir.display());
    println!("cargo:rustc-env=SLUICE_UI_STAMP={:016x}", h.finish());
}

fn stamp(dir: &Path, h: &mut impl Hasher) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        p.hash(h);
        if p.is_dir() {
            stamp(&p, h);
        } else if let Ok(m) = e.metadata() {
            m.len().hash(h);
            m.modified().ok().hash(h);
        }
    }
}
