//! A minimal blocking HTTP/1.1 client over `TcpStream` (keep-alive, one
//! request at a time) for the tests and `kiln bench --serve`. Loopback use
//! only; it knows just enough HTTP for this server's answers.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response: status, headers (lower-cased names) and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One keep-alive connection to `addr`.
pub struct Client {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
    timeout: Duration,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            conn: None,
            timeout: Duration::from_secs(30),
        }
    }

    fn connect(&self) -> io::Result<BufReader<TcpStream>> {
        let s = TcpStream::connect_timeout(&self.addr, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_nodelay(true)?;
        Ok(BufReader::new(s))
    }

    /// `GET path`.
    pub fn get(&mut self, path: &str) -> io::Result<HttpResponse> {
        self.request("GET", path, b"")
    }

    /// `POST path` with a JSON body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> io::Result<HttpResponse> {
        self.request("POST", path, body)
    }

    /// Sends one request on the kept connection (reconnecting once if it was closed).
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<HttpResponse> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str("\r\n");
        for attempt in 0..2 {
            if self.conn.is_none() {
                self.conn = Some(self.connect()?);
            }
            let conn = self.conn.as_mut().expect("connected");
            let sent = conn
                .get_mut()
                .write_all(head.as_bytes())
                .and_then(|_| conn.get_mut().write_all(body));
            match sent.and_then(|_| read_response(conn)) {
                Ok(r) => {
                    if r.header("connection") == Some("close") {
                        self.conn = None;
                    }
                    return Ok(r);
                }
                Err(e)
                    if attempt == 0
                        && matches!(
                            e.kind(),
                            io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::ConnectionReset
                        ) =>
                {
                    self.conn = None;
                }
                Err(e) => {
                    self.conn = None;
                    return Err(e);
                }
            }
        }
        Err(io::Error::other("the connection closed twice"))
    }
}

fn read_response(r: &mut BufReader<TcpStream>) -> io::Result<HttpResponse> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line {line:?}"),
            )
        })?;
    let mut headers = vec![];
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let body = if let Some(len) = get("content-length") {
        let n: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        let mut b = vec![0; n];
        r.read_exact(&mut b)?;
        b
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        let mut b = vec![];
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            b.extend_from_slice(&chunk[..n]);
        }
        b
    } else {
        let mut b = vec![];
        r.read_to_end(&mut b)?;
        b
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// Writes raw bytes to a fresh connection and returns the status of the
/// first response (`None` if the server closed without answering). For
/// malformed-request fuzzing.
pub fn send_raw(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> io::Result<Option<u16>> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut r = BufReader::new(s);
    match read_response(&mut r) {
        Ok(resp) => Ok(Some(resp.status)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::InvalidData
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
