//! The rendezvous of torchrun-style launches (`MASTER_ADDR:MASTER_PORT`):
//! rank 0 listens, every other rank connects and says its rank, and rank 0
//! sends each of them the same bytes (NCCL's unique id). Both sides give up
//! with an error at the deadline.

use kiln_ir::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

fn err(msg: String) -> Error {
    Error::op("init_process_group", msg)
}

/// Rank 0: hands `payload` to the `world - 1` other ranks.
pub(crate) fn serve(
    addr: &str,
    port: u16,
    world: usize,
    payload: &[u8],
    deadline: Instant,
) -> Result<()> {
    let listener = TcpListener::bind((addr, port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| {
            err(format!(
                "rank 0 cannot listen on {addr}:{port} (MASTER_ADDR:MASTER_PORT): {e}"
            ))
        })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| err(format!("rendezvous socket: {e}")))?;
    let mut joined = vec![false; world];
    joined[0] = true;
    while joined.iter().any(|j| !j) {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).ok();
                s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut r = [0u8; 8];
                s.read_exact(&mut r)
                    .map_err(|e| err(format!("rendezvous: reading a rank: {e}")))?;
                let rank = u64::from_le_bytes(r) as usize;
                if rank == 0 || rank >= world || joined[rank] {
                    return Err(err(format!(
                        "rendezvous: a peer says it is rank {rank} (world {world}, already joined: {})",
                        rank < world && joined[rank]
                    )));
                }
                joined[rank] = true;
                s.write_all(&(payload.len() as u64).to_le_bytes())
                    .and_then(|_| s.write_all(payload))
                    .map_err(|e| err(format!("rendezvous: answering rank {rank}: {e}")))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (0..world)
                        .filter(|&r| !joined[r])
                        .map(|r| r.to_string())
                        .collect();
                    return Err(err(format!(
                        "rendezvous at {addr}:{port} timed out: ranks {} never connected",
                        missing.join(", ")
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(err(format!("rendezvous accept: {e}"))),
        }
    }
    Ok(())
}

/// Rank `rank` > 0: fetches rank 0's payload, retrying until rank 0 listens.
pub(crate) fn fetch(addr: &str, port: u16, rank: usize, deadline: Instant) -> Result<Vec<u8>> {
    let target = (addr, port)
        .to_socket_addrs()
        .map_err(|e| err(format!("MASTER_ADDR {addr}:{port}: {e}")))?
        .next()
        .ok_or_else(|| err(format!("MASTER_ADDR {addr}:{port} resolves to nothing")))?;
    loop {
        match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .ok();
                s.write_all(&(rank as u64).to_le_bytes())
                    .map_err(|e| err(format!("rendezvous: sending rank {rank}: {e}")))?;
                let mut n = [0u8; 8];
                s.read_exact(&mut n)
                    .map_err(|e| err(format!("rendezvous: reading rank 0's answer: {e}")))?;
                let mut payload = vec![0u8; u64::from_le_bytes(n) as usize];
                s.read_exact(&mut payload)
                    .map_err(|e| err(format!("rendezvous: reading rank 0's answer: {e}")))?;
                return Ok(payload);
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(err(format!(
                        "rank {rank} could not reach rank 0 at {addr}:{port} (MASTER_ADDR:MASTER_PORT): {e}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_zero_hands_its_bytes_to_every_rank() {
        let port = {
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            l.local_addr().unwrap().port()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let peers: Vec<_> = (1..3)
            .map(|r| std::thread::spawn(move || fetch("127.0.0.1", port, r, deadline)))
            .collect();
        serve("127.0.0.1", port, 3, b"unique-id", deadline).unwrap();
        for p in peers {
            assert_eq!(p.join().unwrap().unwrap(), b"unique-id");
        }
        // nobody comes: a clear timeout naming the missing rank
        let e = serve(
            "127.0.0.1",
            port,
            2,
            b"x",
            Instant::now() + Duration::from_millis(100),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("ranks 1 never connected"), "{e}");
    }
}
