//! What a test does when a tool it needs is missing: under CI (`CI=true`) that is a failure, since a conformance
//! test that silently skips proves nothing; elsewhere it skips, saying why. Included with `#[path]` by the test
//! binaries that need it.

/// Panics under `CI=true`, else prints why the caller returns early.
pub fn skip_unless_ci(why: &str) {
    if matches!(std::env::var("CI").as_deref(), Ok("true" | "1")) {
        panic!("{why}: CI=true requires this test to run (`make test` installs what it needs)");
    }
    eprintln!("skipping: {why}");
}
