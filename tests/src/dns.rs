//! A DNS client for the tests, the demo and the benchmark: one query over UDP or TCP with
//! hickory's client, the reply reduced to text that compares across servers.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use hickory_net::{
    client::{Client, ClientHandle as _},
    runtime::TokioRuntimeProvider,
    tcp::TcpClientStream,
    udp::UdpClientStream,
};
use hickory_proto::{
    op::{Message, ResponseCode},
    rr::{DNSClass, Name, Record, RecordType},
};

/// How long one query may take.
pub const TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// A reply, as text: each record as `name TYPE data`, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: ResponseCode,
    pub authoritative: bool,
    pub truncated: bool,
    pub answers: Vec<String>,
    pub authorities: Vec<String>,
    pub additionals: Vec<String>,
}

impl Reply {
    /// The data of the answers (`10.0.0.1`, `0 100 80 web...`), sorted.
    pub fn data(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .answers
            .iter()
            .filter_map(|a| a.splitn(3, ' ').nth(2).map(str::to_owned))
            .collect();
        out.sort();
        out
    }
}

fn texts(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r.name.to_ascii().to_ascii_lowercase(),
                r.record_type(),
                r.data
            )
        })
        .collect();
    out.sort();
    out
}

impl From<&Message> for Reply {
    fn from(m: &Message) -> Self {
        Reply {
            code: m.metadata.response_code,
            authoritative: m.metadata.authoritative,
            truncated: m.metadata.truncation,
            answers: texts(&m.answers),
            authorities: texts(&m.authorities),
            additionals: texts(&m.additionals),
        }
    }
}

/// Asks `server` for `name` and `rtype` (class IN) over `transport`, with EDNS.
pub async fn query(
    server: SocketAddr,
    transport: Transport,
    name: &str,
    rtype: RecordType,
) -> anyhow::Result<Reply> {
    let name = Name::from_ascii(name).with_context(|| format!("{name:?} is not a name"))?;
    let provider = TokioRuntimeProvider::default();
    let mut client = match transport {
        Transport::Udp => {
            let stream = UdpClientStream::builder(server, provider)
                .with_timeout(Some(TIMEOUT))
                .build();
            let (client, bg) = Client::<TokioRuntimeProvider>::from_sender(stream);
            tokio::spawn(bg);
            client
        }
        Transport::Tcp => {
            let (stream, handle) = TcpClientStream::new(server, None, Some(TIMEOUT), provider);
            let (client, bg) = Client::<TokioRuntimeProvider>::with_timeout(
                stream.await.context("connecting over TCP")?,
                handle,
                TIMEOUT,
            );
            tokio::spawn(bg);
            client
        }
    };
    let response = client
        .query(name.clone(), DNSClass::IN, rtype)
        .await
        .with_context(|| format!("{transport:?} query {name} {rtype} to {server}"))?;
    Ok(Reply::from(&*response))
}

/// [`query`] from synchronous code (its own small runtime).
pub fn query_blocking(
    server: SocketAddr,
    transport: Transport,
    name: &str,
    rtype: RecordType,
) -> anyhow::Result<Reply> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(query(server, transport, name, rtype))
}

/// Sends `packet` over UDP and returns the raw reply, or `None` when none came within a second.
pub fn raw_udp(server: SocketAddr, packet: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let socket = std::net::UdpSocket::bind(if server.is_ipv4() {
        "127.0.0.1:0"
    } else {
        "[::1]:0"
    })?;
    socket.set_read_timeout(Some(Duration::from_secs(1)))?;
    socket.send_to(packet, server)?;
    let mut buf = vec![0u8; 65535];
    match socket.recv(&mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// A free loopback port for a server to listen on (UDP and TCP), picked by the kernel.
pub fn free_port() -> anyhow::Result<u16> {
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(tcp.local_addr()?.port())
}

/// Queries `server` until the zone is ready (no SERVFAIL for `name`), at most `tries` times
/// 100 ms apart; returns the first ready reply.
pub fn wait_ready(server: SocketAddr, name: &str, tries: usize) -> anyhow::Result<Reply> {
    let mut last = None;
    for _ in 0..tries {
        match query_blocking(server, Transport::Udp, name, RecordType::A) {
            Ok(reply) if reply.code != ResponseCode::ServFail => return Ok(reply),
            Ok(reply) => last = Some(format!("{:?}", reply.code)),
            Err(e) => last = Some(format!("{e:#}")),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("DNS at {server} did not become ready: last reply {last:?}")
}
