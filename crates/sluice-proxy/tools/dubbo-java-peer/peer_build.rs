//! Builds the Java Dubbo provider with Maven (shared by the test suites that start it: sluice-proxy's plugin
//! tests and the binary's Zookeeper discovery tests include this file with `#[path]`). The build happens in a
//! scratch copy renamed into place, keyed by a hash of the sources, so concurrent or interrupted builds never leave
//! half of one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The provider's classpath (its jar and Maven's copies of its dependencies) from the sources in `src` (this
/// directory), built into `target` once per source version; `skip` is called (and `None` returned) when java or
/// mvn is missing.
pub fn classpath(src: &Path, target: &Path, skip: fn(&str)) -> Option<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let rel = f.strip_prefix(src).unwrap().to_string_lossy().into_owned();
        for b in rel.bytes().chain(std::fs::read(f).unwrap()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let out = target.join(format!("dubbo-java-peer/{h:016x}"));
    let cp = |d: &Path| {
        format!(
            "{}:{}/*",
            d.join("target/dubbo-java-peer-1.0.jar").display(),
            d.join("target/lib").display()
        )
    };
    if out.join("target/dubbo-java-peer-1.0.jar").exists() {
        return Some(cp(&out));
    }
    for tool in ["java", "mvn"] {
        if Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_err()
        {
            skip(&format!(
                "the Java Dubbo provider needs `{tool}` (Debian: openjdk-17-jdk-headless maven)"
            ));
            return None;
        }
    }
    // Built in a scratch copy renamed into place: a concurrent or interrupted build never leaves half of one.
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let st = Command::new("cp")
        .arg("-r")
        .arg(src.join("pom.xml"))
        .arg(src.join("src"))
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let st = Command::new("mvn")
        .args([
            "-q",
            "-B",
            "package",
            "dependency:copy-dependencies",
            "-DoutputDirectory=target/lib",
        ])
        .current_dir(&tmp)
        .status()
        .expect("run mvn");
    assert!(
        st.success(),
        "mvn build of the Java Dubbo provider failed: {st}"
    );
    eprintln!("built the Java Dubbo provider in {:?}", t0.elapsed());
    if std::fs::rename(&tmp, &out).is_err() {
        // Another process built it meanwhile.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Some(cp(&out))
}
