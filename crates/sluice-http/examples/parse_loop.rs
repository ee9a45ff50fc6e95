//! Parse the bench's request or response `N` times (default 100000), for instruction counting, e.g.
//! `valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/parse_loop request 20000`
//! minus the same with `0`, divided by 20000. Modes: `request`, `response`, `httparse`, `httparse-response`.

use bytes::{BufMut, BytesMut};
use sluice_http::{parse_request, parse_response, Limits};

const REQUEST: &[u8] = b"GET /api/v1/users/12345/profile?fields=name,email&lang=en HTTP/1.1\r\n\
Host: api.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n\
Accept-Language: en-US,en;q=0.5\r\n\
Accept-Encoding: gzip, deflate, br\r\n\
Connection: keep-alive\r\n\
Cookie: session=4f9c2a7e1b3d; theme=dark\r\n\
Upgrade-Insecure-Requests: 1\r\n\
\r\n";

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Server: origin\r\n\
Date: Sun, 22 Nov 2026 04:00:00 GMT\r\n\
Content-Type: application/json; charset=utf-8\r\n\
Content-Length: 1024\r\n\
Cache-Control: no-cache\r\n\
Connection: keep-alive\r\n\
\r\n";

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "request".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let limits = Limits::default();
    let mut buf = BytesMut::with_capacity(4096);
    let mut sum = 0usize;
    for _ in 0..n {
        buf.clear();
        match what.as_str() {
            "response" => {
                buf.put_slice(RESPONSE);
                sum += parse_response(&mut buf, &limits, false)
                    .ok()
                    .flatten()
                    .map_or(0, |h| h.headers.len());
            }
            "httparse-response" => {
                buf.put_slice(RESPONSE);
                let mut headers = [httparse::EMPTY_HEADER; 32];
                let mut res = httparse::Response::new(&mut headers);
                sum += res.parse(&buf).ok().map_or(0, |_| res.headers.len());
            }
            "httparse" => {
                buf.put_slice(REQUEST);
                let mut headers = [httparse::EMPTY_HEADER; 32];
                let mut req = httparse::Request::new(&mut headers);
                sum += req.parse(&buf).ok().map_or(0, |_| req.headers.len());
            }
            _ => {
                buf.put_slice(REQUEST);
                sum += parse_request(&mut buf, &limits)
                    .ok()
                    .flatten()
                    .map_or(0, |h| h.headers.len());
            }
        }
    }
    println!("{sum}");
}
