//! Remote reads against a real HTTP/1.1 server on loopback (a tokio listener answering scripted
//! responses): digests, the 64 MiB cap before any body byte, redirects, the Hub route and its
//! token, and the location policy on redirects (KV-TOK-03..06).

use std::sync::{Arc, Mutex};

use continuum_core::artifacts::card::uri_kind;
use continuum_core::artifacts::{ArtifactRef, FileFormat, Slot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::fetch::{FetchError, Remote, digest, fetch};

/// One scripted answer per path; every request head seen is recorded.
struct Server {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn serve(routes: Vec<(&'static str, Vec<u8>)>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let routes = routes.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let path = text.split_whitespace().nth(1).unwrap_or("").to_owned();
                log.lock().expect("log").push(text);
                let answer = routes.iter().find(|(p, _)| *p == path).map_or_else(
                    || b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
                    |(_, a)| a.clone(),
                );
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Server { addr, seen }
}

fn ok(body: &[u8]) -> Vec<u8> {
    let mut a = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    a.extend_from_slice(body);
    a
}

fn redirect(to: &str) -> Vec<u8> {
    format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n").into_bytes()
}

fn artifact(uri: &str, body: &[u8]) -> ArtifactRef {
    ArtifactRef {
        slot: Slot::Tokenizer,
        format: FileFormat::TokenizerJson,
        uri: uri.to_owned(),
        kind: uri_kind(uri).expect("kind"),
        checksum: digest(body),
        size: None,
    }
}

fn remote(hf: &str) -> Remote {
    Remote {
        allow_http: true,
        hf_endpoint: hf.to_owned(),
        hf_token: Some("hf_secret".into()),
        tls: None,
    }
}

const BODY: &[u8] = b"{\"version\":\"1.0\",\"model\":{\"type\":\"BPE\"}}";

#[tokio::test]
async fn an_http_artifact_is_fetched_and_verified_and_a_wrong_one_refused() {
    let s = serve(vec![
        ("/t.json", ok(BODY)),
        ("/bad.json", ok(b"other bytes")),
    ])
    .await;
    let r = remote("http://127.0.0.1:9");
    let good = artifact(&format!("http://{}/t.json", s.addr), BODY);
    assert_eq!(fetch(&good, &r).await.expect("fetched"), BODY);
    let bad = artifact(&format!("http://{}/bad.json", s.addr), BODY);
    assert!(matches!(
        fetch(&bad, &r).await,
        Err(FetchError::ChecksumMismatch { .. })
    ));
    let missing = artifact(&format!("http://{}/nope", s.addr), BODY);
    assert!(matches!(
        fetch(&missing, &r).await,
        Err(FetchError::Unreadable(m)) if m.contains("404")
    ));
    // No Hub token leaves for a plain http(s) artifact.
    assert!(
        s.seen
            .lock()
            .expect("log")
            .iter()
            .all(|h| !h.to_ascii_lowercase().contains("authorization"))
    );
}

#[tokio::test]
async fn a_declared_length_over_64_mib_is_refused_before_the_body() {
    let huge = b"HTTP/1.1 200 OK\r\ncontent-length: 67108865\r\n\r\n{".to_vec();
    let exact = b"HTTP/1.1 200 OK\r\ncontent-length: 67108864\r\n\r\n{".to_vec();
    let s = serve(vec![("/huge", huge), ("/exact", exact)]).await;
    let r = remote("http://127.0.0.1:9");
    let a = artifact(&format!("http://{}/huge", s.addr), BODY);
    assert!(matches!(fetch(&a, &r).await, Err(FetchError::TooLarge)));
    // Exactly 64 MiB declared is not refused for its size (the body then ends early).
    let a = artifact(&format!("http://{}/exact", s.addr), BODY);
    assert!(matches!(
        fetch(&a, &r).await,
        Err(FetchError::Unreadable(_))
    ));
}

#[tokio::test]
async fn a_chunked_body_over_64_mib_is_cut_off() {
    // 65 chunks of 1 MiB with no declared length.
    let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let chunk = vec![b'a'; 1024 * 1024];
    for _ in 0..65 {
        answer.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        answer.extend_from_slice(&chunk);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"0\r\n\r\n");
    let s = serve(vec![("/big", answer)]).await;
    let a = artifact(&format!("http://{}/big", s.addr), BODY);
    assert!(matches!(
        fetch(&a, &remote("http://127.0.0.1:9")).await,
        Err(FetchError::TooLarge)
    ));
}

#[tokio::test]
async fn redirects_are_followed_and_plain_http_is_refused_where_not_allowed() {
    let s = serve(vec![("/a", redirect("/b")), ("/b", ok(BODY))]).await;
    let mut r = remote("http://127.0.0.1:9");
    let a = artifact(&format!("http://{}/a", s.addr), BODY);
    assert_eq!(fetch(&a, &r).await.expect("followed"), BODY);
    let hops = s.seen.lock().expect("log").len();
    assert_eq!(hops, 2, "one redirect, then the file");
    // Without allow_http_artifacts no plain-http location is read, first hop or redirect.
    r.allow_http = false;
    let target = format!("http://{}/a", s.addr);
    assert!(matches!(
        super::fetch::get_for_tests(&target, &r).await,
        Err(FetchError::Refused(_))
    ));
    assert_eq!(s.seen.lock().expect("log").len(), hops, "nothing was sent");
    // A redirect loop ends.
    let looping = serve(vec![("/l", redirect("/l"))]).await;
    r.allow_http = true;
    let target = format!("http://{}/l", looping.addr);
    assert!(matches!(
        super::fetch::get_for_tests(&target, &r).await,
        Err(FetchError::Unreadable(m)) if m.contains("redirects")
    ));
}

/// A Dynamo 1.4/1.5 card names a model without an organisation as `hf://<model>/<file>`: fetched
/// from `<hub>/<model>/resolve/main/<file>` and verified like any other.
#[tokio::test]
async fn an_hf_reference_without_an_organisation_is_the_repo_and_its_file() {
    let hub = serve(vec![("/tiny-agg/resolve/main/tokenizer.json", ok(BODY))]).await;
    let r = remote(&format!("http://{}", hub.addr));
    let a = artifact("hf://tiny-agg/tokenizer.json", BODY);
    assert_eq!(fetch(&a, &r).await.expect("fetched"), BODY);
    assert_eq!(hub.seen.lock().expect("log").len(), 1);
    // The digest still decides: other bytes under that name are refused.
    let wrong = artifact("hf://tiny-agg/tokenizer.json", b"something else");
    assert!(matches!(
        fetch(&wrong, &r).await,
        Err(FetchError::ChecksumMismatch { .. })
    ));
}

#[tokio::test]
async fn hf_references_use_the_hub_route_and_send_the_token_to_the_hub_only() {
    let cdn = serve(vec![("/blob", ok(BODY))]).await;
    let hub = serve(vec![(
        "/org/repo/resolve/main/tokenizer.json",
        redirect(&format!("http://{}/blob", cdn.addr)),
    )])
    .await;
    let r = remote(&format!("http://{}", hub.addr));
    let a = artifact("hf://org/repo/tokenizer.json", BODY);
    assert_eq!(fetch(&a, &r).await.expect("fetched"), BODY);
    let hub_seen = hub.seen.lock().expect("log").clone();
    assert_eq!(hub_seen.len(), 1);
    assert!(
        hub_seen[0]
            .to_ascii_lowercase()
            .contains("authorization: bearer hf_secret"),
        "{hub_seen:?}"
    );
    let cdn_seen = cdn.seen.lock().expect("log").clone();
    assert_eq!(cdn_seen.len(), 1);
    assert!(
        !cdn_seen[0].to_ascii_lowercase().contains("authorization"),
        "the token stays with the Hub: {cdn_seen:?}"
    );
    // The operator's plain-http Hub endpoint is read, but its redirect to a plain-http host is
    // not without allow_http_artifacts.
    let mut strict = r;
    strict.allow_http = false;
    assert!(matches!(
        fetch(&a, &strict).await,
        Err(FetchError::Refused(_))
    ));
    assert_eq!(hub.seen.lock().expect("log").len(), 2, "the Hub was asked");
    assert_eq!(
        cdn.seen.lock().expect("log").len(),
        1,
        "the redirect was not followed"
    );
}

#[tokio::test]
async fn local_files_are_read_by_path_and_file_uri_and_capped() {
    let dir = std::env::temp_dir().join(format!("continuum-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, BODY).expect("write");
    let r = remote("http://127.0.0.1:9");
    let path = p.to_str().expect("utf-8");
    assert_eq!(fetch(&artifact(path, BODY), &r).await.expect("path"), BODY);
    let uri = format!("file://{path}");
    assert_eq!(fetch(&artifact(&uri, BODY), &r).await.expect("uri"), BODY);
    // A sparse file one byte over 64 MiB: refused from its size, not read.
    let big = dir.join("big.json");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(64 * 1024 * 1024 + 1).expect("set_len");
    let big_path = big.to_str().expect("utf-8");
    assert!(matches!(
        fetch(&artifact(big_path, BODY), &r).await,
        Err(FetchError::TooLarge)
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Exactly [`super::fetch::MAX_REDIRECTS`] (5) redirects are followed; a sixth is refused before it
/// is requested (KV-TOK-03).
#[tokio::test]
async fn five_redirects_are_followed_and_a_sixth_is_not() {
    let chain = |hops: usize| -> Vec<(&'static str, Vec<u8>)> {
        const PATHS: [&str; 8] = ["/r0", "/r1", "/r2", "/r3", "/r4", "/r5", "/r6", "/r7"];
        let mut routes: Vec<(&'static str, Vec<u8>)> = (0..hops)
            .map(|i| (PATHS[i], redirect(PATHS[i + 1])))
            .collect();
        routes.push((PATHS[hops], ok(BODY)));
        routes
    };
    assert_eq!(super::fetch::MAX_REDIRECTS, 5);
    let r = remote("http://127.0.0.1:9");
    let five = serve(chain(5)).await;
    let a = artifact(&format!("http://{}/r0", five.addr), BODY);
    assert_eq!(fetch(&a, &r).await.expect("five redirects followed"), BODY);
    assert_eq!(
        five.seen.lock().expect("log").len(),
        6,
        "five hops, then the file"
    );
    let six = serve(chain(6)).await;
    let a = artifact(&format!("http://{}/r0", six.addr), BODY);
    assert!(matches!(
        fetch(&a, &r).await,
        Err(FetchError::Unreadable(m)) if m.contains("redirects")
    ));
    assert_eq!(
        six.seen.lock().expect("log").len(),
        6,
        "the sixth location is never requested"
    );
}
