//! The DNS server: hickory-server's [`Server`] with a [`RequestHandler`] that answers from the
//! node's [`DnsZone`]. Each `--dns-listen` address gets UDP sockets (one per core, with
//! `SO_REUSEPORT`, so the kernel spreads queries over them) and a TCP listener.
//!
//! Malformed messages get FORMERR from hickory itself (the handler never sees them); the
//! handler answers opcodes other than QUERY with NOTIMP, more or less than one question with
//! FORMERR, EDNS versions above 0 with BADVERS, classes other than IN with REFUSED, and
//! everything else from [`Zone::answer`](super::zone::Zone::answer). Answers that do not fit
//! the client's UDP size are truncated with TC set (hickory's encoder); TCP carries them whole.

use std::{net::SocketAddr, time::Duration};

use hickory_server::{
    Server,
    net::runtime::Time,
    proto::{
        op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode},
        rr::DNSClass,
    },
    server::{Request, RequestHandler, ResponseHandler, ResponseInfo},
    zone_handler::MessageResponseBuilder,
};
use tracing::{debug, info};

use super::DnsZone;

/// How long a TCP connection may stay idle.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-connection buffer of TCP responses.
const TCP_RESPONSE_BUFFER: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum DnsServerError {
    #[error("DNS: cannot listen on {proto} {addr}: {source}")]
    Bind {
        proto: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

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
        let response_edns = request.edns.as_ref().map(|req| {
            let mut edns = Edns::new();
            edns.set_max_payload(req.max_payload().max(512));
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
                let response = builder.build(
                    metadata,
                    answer.answers(),
                    answer.authorities(),
                    [],
                    answer.additionals(),
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

/// A running DNS server; it stops when dropped.
pub struct DnsServer {
    server: Server<ZoneRequestHandler>,
    /// The bound addresses (UDP and TCP share each port).
    pub addresses: Vec<SocketAddr>,
}

impl DnsServer {
    /// Stops serving.
    pub async fn shutdown(mut self) {
        let _ = self.server.shutdown_gracefully().await;
    }
}

fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Binds every address (UDP and TCP) and serves `zone` on them. Must run inside a tokio
/// runtime. A port of 0 is chosen by the kernel once and shared by UDP and TCP.
pub async fn serve(listen: &[SocketAddr], zone: DnsZone) -> Result<DnsServer, DnsServerError> {
    let mut server = Server::new(ZoneRequestHandler::new(zone));
    let mut addresses = Vec::new();
    let sockets = std::thread::available_parallelism().map_or(1, |n| n.get());
    for requested in listen {
        let tcp = tokio::net::TcpListener::bind(requested)
            .await
            .map_err(|source| DnsServerError::Bind {
                proto: "TCP",
                addr: *requested,
                source,
            })?;
        let addr = tcp.local_addr().unwrap_or(*requested);
        for _ in 0..sockets {
            let udp = udp_socket(addr)
                .and_then(tokio::net::UdpSocket::from_std)
                .map_err(|source| DnsServerError::Bind {
                    proto: "UDP",
                    addr,
                    source,
                })?;
            server.register_socket(udp);
        }
        server.register_listener(tcp, TCP_TIMEOUT, TCP_RESPONSE_BUFFER);
        info!(%addr, "serving clusterset.local DNS on UDP and TCP");
        addresses.push(addr);
    }
    Ok(DnsServer { server, addresses })
}
