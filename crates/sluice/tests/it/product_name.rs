//! One product name on every answer the gateway writes itself (issue 11): the `Server` header and the HTML error
//! page's footer of the proxy's own 404, 429 and 503 (plugin rejections with a bare status), 502 (upstream
//! refused), and the Admin API's answers (200 and 401, whose `Server` also names the APISIX version implemented),
//! all from the real binary.

use crate::support::client::Response;
use crate::support::process::{Mock, Sluice};
use crate::support::{refused_addr, t, Client};

const KEY: &str = "it-name-key-0123456789";
const NAME: &str = "sluice";

/// The name in nginx's error-page footer (`<hr><center>NAME</center>`), if the body is such a page.
fn footer(r: &Response) -> Option<String> {
    let body = r.text();
    let at = body.find("<hr><center>")? + "<hr><center>".len();
    let end = body[at..].find("</center>")?;
    Some(body[at..at + end].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_header_and_error_pages_carry_one_product_name() {
    t(async {
        let mock = Mock::start(5).await;
        let limit = |code: u16| {
            format!(
                "    plugins:\n      limit-count:\n        count: 1\n        time_window: 60\n        rejected_code: {code}\n        key: remote_addr\n"
            )
        };
        let yaml = format!(
            "routes:\n\
             \x20 - id: 1\n    uri: /r429\n{}    upstream:\n      nodes:\n        \"{m}\": 1\n\
             \x20 - id: 2\n    uri: /r503\n{}    upstream:\n      nodes:\n        \"{m}\": 1\n\
             \x20 - id: 3\n    uri: /r502\n    upstream:\n      nodes:\n        \"{dead}\": 1\n\
             #END\n",
            limit(429),
            limit(503),
            m = mock.addr,
            dead = refused_addr(),
        );
        let (gw, admin) = Sluice::start_traditional(Some(&yaml), KEY, None).await;

        let mut answers: Vec<(&str, Response)> = Vec::new();
        answers.push(("404", Client::connect(gw.addr).await.get("/nowhere").await));
        for path in ["/r429", "/r503"] {
            let first = Client::connect(gw.addr).await.get(path).await;
            assert_eq!(first.status, 200, "{path}: the first request is within the limit");
            answers.push((path, Client::connect(gw.addr).await.get(path).await));
        }
        answers.push(("/r502", Client::connect(gw.addr).await.get("/r502").await));
        let mut a = Client::connect(admin).await;
        let ok = a
            .request("GET", "/apisix/admin/routes", &format!("X-API-KEY: {KEY}\r\n"), b"")
            .await;
        answers.push(("admin 200", ok));
        let mut a = Client::connect(admin).await;
        answers.push(("admin 401", a.request("GET", "/apisix/admin/routes", "", b"").await));

        let summary: Vec<String> = answers
            .iter()
            .map(|(what, r)| format!("{what}: {}{}", r.raw_head, r.text()))
            .collect();
        let statuses: Vec<u16> = answers.iter().map(|(_, r)| r.status).collect();
        assert_eq!(statuses, [404, 429, 503, 502, 200, 401], "{summary:#?}");
        // The proxy says only its name; the Admin API puts its name first and then the APISIX version it
        // implements, the token APISIX clients (ADC: `/APISIX\/(.*)/`) read the version from.
        let admin_server = format!(
            "{NAME}/{} APISIX/{}",
            env!("CARGO_PKG_VERSION"),
            sluice_admin::APISIX_VERSION
        );
        for (what, r) in &answers {
            let want = if what.starts_with("admin") { admin_server.as_str() } else { NAME };
            assert_eq!(r.header("server"), Some(want), "{what}: Server header\n{}", r.raw_head);
            let product = r.header("server").and_then(|s| s.split('/').next());
            assert_eq!(product, Some(NAME), "{what}: one product name");
        }
        // The three HTML pages: two from the plugins' bare-status rejection, one from the proxy's 502.
        let footers: Vec<Option<String>> = answers[1..4].iter().map(|(_, r)| footer(r)).collect();
        assert_eq!(footers, vec![Some(NAME.to_owned()); 3], "{summary:#?}");
        drop(gw);
    })
    .await
}
