//! The DNS server: hickory-server's [`Server`] with a [`RequestHandler`] that answers from the
//! node's [`DnsZone`]. Each `--dns-listen` address gets a UDP socket, read by one thread per
//! core ([`DnsServer`]), and a TCP listener with a cap on open connections ([`super::tcp`]).
//!
//! Malformed messages get FORMERR from hickory over UDP and from [`super::tcp`] over TCP (the
//! handler never sees them; over TCP none for one that says it is a response); the
//! handler answers opcodes other than QUERY with NOTIMP, more or less than one question with
//! FORMERR, EDNS versions above 0 with BADVERS, classes other than IN with REFUSED, and
//! everything else from [`Zone::answer`](super::zone::Zone::answer). Answers that do not fit
//! the client's UDP size are truncated with TC set (hickory's encoder); TCP carries them whole.
//! Additional records (SRV targets' addresses) that do not fit are left out first, without TC
//! (RFC 2181 §9), so a client need not ask again over TCP for data it can look up itself.

use std::net::SocketAddr;

use hickory_server::{
    Server,
    net::{runtime::Time, xfer::Protocol},
    proto::{
        op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode},
        rr::{DNSClass, Record},
        serialize::binary::{BinEncodable, BinEncoder},
    },
    server::{Request, RequestHandler, ResponseHandler, ResponseInfo},
    zone_handler::MessageResponseBuilder,
};
use tracing::{debug, error, info};

use super::DnsZone;

#[derive(Debug, thiserror::Error)]
pub enum DnsServerError {
    #[error("DNS: cannot listen on {proto} {addr}: {source}")]
    Bind {
        proto: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("DNS: cannot start a serving thread: {0}")]
    Thread(std::io::Error),
}

/// The largest UDP reply, whatever the client offers: 1232 bytes fit an IPv6 packet on any
/// link without fragments (DNS Flag Day 2020), which are lost or spoofable on many paths; a
/// larger answer is truncated and the client asks again over TCP.
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// Answers queries from the zone.
#[derive(Clone, Debug)]
pub struct ZoneRequestHandler {
    zone: DnsZone,
}

impl ZoneRequestHandler {
    pub fn new(zone: DnsZone) -> Self {
        ZoneRequestHandler { zone }
    }
}

#[async_trait::async_trait]
impl RequestHandler for ZoneRequestHandler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let udp_limit = request
            .edns
            .as_ref()
            .map_or(512, |req| req.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        let response_edns = request.edns.as_ref().map(|_| {
            let mut edns = Edns::new();
            edns.set_max_payload(udp_limit);
            edns.set_version(0);
            edns
        });
        let builder = MessageResponseBuilder::new(&request.queries, response_edns.as_ref());
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = false;
        let queries = request.queries.queries();
        let refused = if request.metadata.op_code != OpCode::Query {
            Some(ResponseCode::NotImp)
        } else if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            Some(ResponseCode::BADVERS)
        } else if queries.len() != 1 {
            Some(ResponseCode::FormErr)
        } else if !matches!(queries[0].query_class(), DNSClass::IN | DNSClass::ANY) {
            Some(ResponseCode::Refused)
        } else {
            None
        };
        let sent = match (refused, queries.first()) {
            (None, Some(query)) => {
                // The guard is dropped at once; the answer shares the records.
                let answer = self.zone.read().answer(query.name(), query.query_type());
                metadata.response_code = answer.code;
                metadata.authoritative = answer.authoritative;
                let additionals = match request.protocol() {
                    // The OPT record, when the reply has one, comes after the additionals.
                    Protocol::Udp => fitting_additionals(
                        request.queries.as_bytes(),
                        answer.answers().iter().chain(answer.authorities()),
                        answer.additionals(),
                        usize::from(udp_limit) - response_edns.as_ref().map_or(0, |_| OPT_RECORD),
                    ),
                    _ => answer.additionals(),
                };
                let response = builder.build(
                    metadata,
                    answer.answers(),
                    answer.authorities(),
                    [],
                    additionals,
                );
                response_handle.send_response(response).await
            }
            (code, _) => {
                metadata.response_code = code.unwrap_or(ResponseCode::FormErr);
                response_handle
                    .send_response(builder.build_no_records(metadata))
                    .await
            }
        };
        sent.unwrap_or_else(|e| {
            debug!(error = %e, "DNS: sending a response failed");
            let mut metadata = Metadata::response_from_request(&request.metadata);
            metadata.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata,
                counts: HeaderCounts::default(),
            })
        })
    }
}

/// The size of an OPT record with no options, kept free for it after the additionals.
const OPT_RECORD: usize = 11;

/// The start of `additionals` that fits in `limit` bytes of a UDP reply after the question (as
/// the request sent it, which the reply repeats) and `sections`, and that ends with a whole
/// owner's records. Measured by encoding them as hickory
/// encodes the reply (the same name compression, and the same room each record needs while it
/// is written). All of them when the answer itself does not fit (the encoder then truncates
/// it, with TC) or cannot be measured.
fn fitting_additionals<'a>(
    question: &[u8],
    sections: impl Iterator<Item = &'a Record>,
    additionals: &'a [Record],
    limit: usize,
) -> &'a [Record] {
    // Only SRV answers have additionals: every other query is answered without measuring.
    if additionals.is_empty() {
        return additionals;
    }
    let mut buf = Vec::with_capacity(limit);
    let mut encoder = BinEncoder::new(&mut buf);
    encoder.set_max_size(u16::try_from(limit).unwrap_or(u16::MAX));
    let measured = || -> Result<usize, hickory_server::proto::ProtoError> {
        encoder.emit_vec(&[0; 12])?; // the header
        let start = encoder.offset();
        encoder.emit_vec(question)?;
        encoder.store_label_pointer(start, start + question.len());
        for r in sections {
            r.emit(&mut encoder)?;
        }
        let mut whole = 0;
        for (i, r) in additionals.iter().enumerate() {
            if r.emit(&mut encoder).is_err() {
                break;
            }
            if additionals
                .get(i + 1)
                .is_none_or(|next| next.name != r.name)
            {
                whole = i + 1;
            }
        }
        Ok(whole)
    };
    let keep = measured().unwrap_or(additionals.len());
    &additionals[..keep]
}

/// A running DNS server: one thread per core, each with its own single-threaded runtime reading
/// the same UDP socket of each address, so a query is received, answered and sent on one thread
/// with no hand-over between threads, by whichever thread is free (the node's map syncs run
/// elsewhere and never delay it). The first thread also serves TCP. It stops when dropped.
pub struct DnsServer {
    /// Dropping it tells every thread to stop.
    _stop: tokio::sync::watch::Sender<()>,
    /// The bound addresses (UDP and TCP share each port).
    pub addresses: Vec<SocketAddr>,
}

/// A non-blocking socket of `kind` bound to `addr` (and listening, for TCP). An IPv6 socket
/// serves IPv6 only: with Linux's default `bindv6only=0`, `[::]:PORT` would also take
/// `0.0.0.0:PORT`, and a dual-stack listen list (`0.0.0.0:5353` and `[::]:5353`) would fail.
fn bound(addr: SocketAddr, kind: socket2::Type) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let stream = kind == Type::STREAM;
    let protocol = if stream { Protocol::TCP } else { Protocol::UDP };
    let socket = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // As std's TcpListener::bind does: a restarted agent rebinds despite TIME_WAIT.
    socket.set_reuse_address(stream)?;
    socket.bind(&addr.into())?;
    if stream {
        socket.listen(1024)?;
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    bound(addr, socket2::Type::DGRAM).map(Into::into)
}

/// The sockets of one serving thread.
struct ThreadSockets {
    udp: Vec<std::net::UdpSocket>,
    tcp: Vec<std::net::TcpListener>,
}

/// Serves `sockets` on this thread until `stop` is dropped, at most `max_tcp` TCP connections
/// at once.
fn serve_thread(
    index: usize,
    sockets: ThreadSockets,
    zone: DnsZone,
    max_tcp: usize,
    mut stop: tokio::sync::watch::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(thread = index, error = %e, "DNS: cannot start a serving thread");
            return;
        }
    };
    runtime.block_on(async move {
        let handler = ZoneRequestHandler::new(zone);
        let mut server = Server::new(handler.clone());
        let mut udp_sockets = 0;
        for udp in sockets.udp {
            match tokio::net::UdpSocket::from_std(udp) {
                Ok(udp) => {
                    server.register_socket(udp);
                    udp_sockets += 1;
                }
                Err(e) => error!(thread = index, error = %e, "DNS: a UDP socket failed"),
            }
        }
        // One cap over every listen address.
        let limits = super::tcp::Limits::new(max_tcp);
        for tcp in sockets.tcp {
            match tokio::net::TcpListener::from_std(tcp) {
                // Ends with this thread's runtime, when `stop` is dropped.
                Ok(tcp) => drop(tokio::spawn(super::tcp::serve(
                    tcp,
                    handler.clone(),
                    limits.clone(),
                ))),
                Err(e) => error!(thread = index, error = %e, "DNS: a TCP listener failed"),
            }
        }
        tokio::select! {
            // Without a UDP socket, hickory's server has nothing to wait for; TCP goes on.
            done = server.block_until_done(), if udp_sockets > 0 => {
                if let Err(e) = done {
                    error!(thread = index, error = %e, "DNS: serving stopped");
                }
            }
            _ = stop.changed() => {
                let _ = server.shutdown_gracefully().await;
            }
        }
    });
}

/// The most serving threads: a few threads answer far more queries than one node's pods ask.
const MAX_THREADS: usize = 4;

/// Binds every address (UDP and TCP) and serves `zone` on them from threads of its own, at
/// most `max_tcp` TCP connections at once. A port of 0 is chosen by the kernel once and shared
/// by UDP and TCP.
pub fn serve(
    listen: &[SocketAddr],
    zone: DnsZone,
    max_tcp: usize,
) -> Result<DnsServer, DnsServerError> {
    // One thread per core, up to MAX_THREADS: every thread waits on the one UDP socket, and
    // each datagram wakes them all (a 64-core node would wake 64 for each query).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
    let mut per_thread: Vec<ThreadSockets> = (0..threads)
        .map(|_| ThreadSockets {
            udp: Vec::new(),
            tcp: Vec::new(),
        })
        .collect();
    let mut addresses = Vec::new();
    for requested in listen {
        let bind_error = |proto, addr, source| DnsServerError::Bind {
            proto,
            addr,
            source,
        };
        let tcp: std::net::TcpListener = bound(*requested, socket2::Type::STREAM)
            .map(Into::into)
            .map_err(|e| bind_error("TCP", *requested, e))?;
        let addr = tcp.local_addr().unwrap_or(*requested);
        // One socket, read by every thread: whichever is free takes the next query.
        let udp = udp_socket(addr).map_err(|e| bind_error("UDP", addr, e))?;
        for sockets in &mut per_thread {
            sockets
                .udp
                .push(udp.try_clone().map_err(|e| bind_error("UDP", addr, e))?);
        }
        if let Some(first) = per_thread.first_mut() {
            first.tcp.push(tcp);
        }
        info!(%addr, threads, "serving clusterset.local DNS on UDP and TCP");
        addresses.push(addr);
    }
    let (stop, stopped) = tokio::sync::watch::channel(());
    for (index, sockets) in per_thread.into_iter().enumerate() {
        let (zone, stopped) = (zone.clone(), stopped.clone());
        std::thread::Builder::new()
            .name(format!("dns-{index}"))
            .spawn(move || serve_thread(index, sockets, zone, max_tcp, stopped))
            .map_err(DnsServerError::Thread)?;
    }
    Ok(DnsServer {
        _stop: stop,
        addresses,
    })
}
