use serde_json::json;
use sluice_secrets::DataEncryption;

use super::*;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-embedded-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d.join("sluice.redb")
}

fn put(key: &str, value: serde_json::Value) -> Op {
    Op::Put {
        key: key.into(),
        value,
        expect_mod: None,
    }
}

#[tokio::test]
async fn commits_survive_reopen_with_history() {
    let path = tmp("reopen");
    {
        let s = EmbeddedStore::open(&path).unwrap();
        let mut rx = s.subscribe();
        let r1 = s
            .commit(vec![put("routes/1", json!({"uri": "/a", "plugins": {}}))])
            .await
            .unwrap();
        assert_eq!(r1, 1);
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().resources.routes.len(), 1);
        let r2 = s
            .commit(vec![
                Op::Delete {
                    key: "routes/1".into(),
                    expect_mod: Some(1),
                },
                put("upstreams/1", json!({"nodes": {}})),
            ])
            .await
            .unwrap();
        assert_eq!(r2, 2);
        // A stale guard changes nothing.
        let err = s
            .commit(vec![
                put("routes/x", json!({})),
                Op::Delete {
                    key: "upstreams/1".into(),
                    expect_mod: Some(1),
                },
            ])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict(_)));
        assert!(s.snapshot().get("routes/x").is_none());
    }
    let s = EmbeddedStore::open(&path).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.revision, 2);
    assert!(snap.get("routes/1").is_none());
    assert_eq!(snap.get("upstreams/1").unwrap().create_revision, 2);
    assert_eq!(s.subscribe().borrow().revision, 2);
    let h = s.history(0, 10).await.unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h[1].changes.len(), 2);
    assert_eq!(
        h[1].changes[0].old,
        Some(json!({"uri": "/a", "plugins": {}}))
    );
    assert_eq!(s.history(1, 10).await.unwrap().len(), 1);
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

/// Child side of the crash test: writes pairs of keys forever, printing each acknowledged revision.
#[tokio::test]
async fn crash_writer_child() {
    let Ok(path) = std::env::var("SLUICE_CRASH_WRITER") else {
        return;
    };
    let s = EmbeddedStore::open(std::path::Path::new(&path)).unwrap();
    for i in 0..100_000u64 {
        let v = json!({"n": i});
        let rev = s
            .commit(vec![
                put(&format!("a/{i}"), v.clone()),
                put(&format!("b/{i}"), v),
            ])
            .await
            .unwrap();
        println!("ACK {rev} {i}");
    }
}

/// `kill -9` during writes: every acknowledged write is there after reopening, and no commit is half-applied.
#[test]
fn kill_9_loses_no_acknowledged_write() {
    use std::io::BufRead;
    let path = tmp("crash");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "embedded::tests::crash_writer_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SLUICE_CRASH_WRITER", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut last_acked = None;
    while let Some(Ok(line)) = lines.next() {
        if let Some(rest) = line.strip_prefix("ACK ") {
            let i: u64 = rest.split(' ').nth(1).unwrap().parse().unwrap();
            last_acked = Some(i);
            if i >= 30 {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let last = last_acked.expect("child acknowledged writes");
    let s = EmbeddedStore::open(&path).unwrap();
    let snap = s.snapshot();
    for i in 0..=last {
        assert!(
            snap.get(&format!("a/{i}")).is_some(),
            "acknowledged write {i} lost"
        );
    }
    let a = snap.list("a").count();
    let b = snap.list("b").count();
    assert_eq!(a, b, "a commit was half-applied");
    assert_eq!(snap.revision as usize, a);
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

#[tokio::test]
async fn prepared_candidate_is_published_with_its_token_only_on_its_base() {
    let path = tmp("prepared");
    let s = EmbeddedStore::open(&path).unwrap();
    let rx = s.subscribe();
    let ops = vec![put("routes/1", json!({"uri": "/a", "plugins": {}}))];
    let mut candidate = s.snapshot().as_ref().clone();
    candidate.apply(&ops, 1);
    let prepared = Prepared {
        base: 0,
        resources: candidate.to_resources(&DataEncryption::none()),
        token: 7,
        view: None,
    };
    assert_eq!(s.commit_prepared(ops, prepared).await.unwrap(), 1);
    assert_eq!(rx.borrow().token, 7);
    assert_eq!(rx.borrow().resources.routes.len(), 1);

    // Prepared against revision 0 but the store is at 1: ignored, derived again, no token.
    let ops = vec![put("routes/2", json!({"uri": "/b", "plugins": {}}))];
    let stale = Prepared {
        base: 0,
        resources: sluice_model::Resources::default(),
        token: 8,
        view: None,
    };
    assert_eq!(s.commit_prepared(ops, stale).await.unwrap(), 2);
    assert_eq!(rx.borrow().token, 0);
    assert_eq!(rx.borrow().resources.routes.len(), 2);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A bulk load hands the commit its candidate store view; what is stored, published and recorded is what
/// applying the ops gives, and a view prepared on another base is ignored.
#[tokio::test]
async fn a_prepared_view_commits_as_applying_the_ops_would() {
    let (pa, pb) = (tmp("view-a"), tmp("view-b"));
    let (a, b) = (
        EmbeddedStore::open(&pa).unwrap(),
        EmbeddedStore::open(&pb).unwrap(),
    );
    let seed = vec![
        put("routes/1", json!({"uri": "/a", "plugins": {}})),
        put("routes/2", json!({"uri": "/b", "plugins": {}})),
    ];
    a.commit(seed.clone()).await.unwrap();
    b.commit(seed).await.unwrap();
    let ops = vec![
        put("routes/1", json!({"uri": "/a2", "plugins": {}})),
        put("routes/3", json!({"uri": "/c", "plugins": {}})),
        Op::Delete {
            key: "routes/2".into(),
            expect_mod: Some(1),
        },
    ];
    let mut view = a.snapshot().as_ref().clone();
    view.apply(&ops, 2);
    let prepared = Prepared {
        base: 1,
        resources: view.to_resources(&DataEncryption::none()),
        token: 0,
        view: Some(view),
    };
    assert_eq!(a.commit_prepared(ops.clone(), prepared).await.unwrap(), 2);
    assert_eq!(b.commit(ops).await.unwrap(), 2);
    assert_eq!(*a.snapshot(), *b.snapshot());
    let strip = |mut h: Vec<Revision>| {
        h.iter_mut().for_each(|r| r.time = 0);
        h
    };
    assert_eq!(
        strip(a.history(0, 10).await.unwrap()),
        strip(b.history(0, 10).await.unwrap())
    );
    // Reopened, the rows written from the view read back the same.
    drop(a);
    assert_eq!(*EmbeddedStore::open(&pa).unwrap().snapshot(), *b.snapshot());

    // A view prepared on an older base (here: one that would undo routes/3) is not taken.
    let a = EmbeddedStore::open(&pa).unwrap();
    let mut stale = Snapshot::default();
    stale.apply(&[put("routes/9", json!({"uri": "/z", "plugins": {}}))], 3);
    let ops = vec![put("routes/4", json!({"uri": "/d", "plugins": {}}))];
    let prepared = Prepared {
        base: 1,
        resources: sluice_model::Resources::default(),
        token: 0,
        view: Some(stale),
    };
    assert_eq!(a.commit_prepared(ops, prepared).await.unwrap(), 3);
    let snap = a.snapshot();
    assert!(snap.get("routes/3").is_some() && snap.get("routes/4").is_some());
    assert!(snap.get("routes/9").is_none());
    drop(a);
    for p in [pa, pb] {
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}
