//! A test backend: answers every TCP connection and UDP datagram with `<id> <local addr>\n`.
//!
//! `mcs-echo --id a/10.99.1.10 tcp:10.99.1.10:8080 udp:10.99.1.10:5353 ...`
//! Prints `ready` on stdout once every socket is bound.

use std::{
    io::Write as _,
    net::{SocketAddr, TcpListener, UdpSocket},
    thread,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut id = String::from("echo");
    let mut listens = Vec::new();
    while let Some(a) = args.next() {
        if a == "--id" {
            id = args.next().unwrap_or_default();
        } else {
            listens.push(a);
        }
    }
    let mut handles = Vec::new();
    for spec in listens {
        let Some((proto, addr)) = spec.split_once(':') else {
            eprintln!("bad listen spec {spec:?}: want tcp:ADDR:PORT or udp:ADDR:PORT");
            std::process::exit(2);
        };
        let addr: SocketAddr = match addr.parse() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("bad address {addr:?}: {e}");
                std::process::exit(2);
            }
        };
        let id = id.clone();
        match proto {
            "tcp" => {
                let listener = TcpListener::bind(addr).unwrap_or_else(|e| {
                    eprintln!("bind tcp {addr}: {e}");
                    std::process::exit(1)
                });
                handles.push(thread::spawn(move || {
                    for conn in listener.incoming().flatten() {
                        let mut conn = conn;
                        let local = conn.local_addr().map(|a| a.to_string()).unwrap_or_default();
                        let _ = writeln!(conn, "{id} {local}");
                    }
                }));
            }
            "udp" => {
                let socket = UdpSocket::bind(addr).unwrap_or_else(|e| {
                    eprintln!("bind udp {addr}: {e}");
                    std::process::exit(1)
                });
                handles.push(thread::spawn(move || {
                    let mut buf = [0u8; 1500];
                    let local = socket
                        .local_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    while let Ok((_, from)) = socket.recv_from(&mut buf) {
                        let _ = socket.send_to(format!("{id} {local}\n").as_bytes(), from);
                    }
                }));
            }
            other => {
                eprintln!("unknown protocol {other:?}");
                std::process::exit(2);
            }
        }
    }
    println!("ready");
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
}
