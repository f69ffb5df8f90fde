//! DNS over TCP, with a cap on open connections. hickory-server's own TCP listener accepts
//! without limit, and on a failed accept (EMFILE, when the process is out of descriptors) it
//! tries again at once, so a client that opens connections and keeps them busy could take
//! every descriptor and memory of an agent on every node, and then spin it on a core. This
//! accept loop admits at most `max` connections at once over all the listen addresses, and an
//! eighth of that (at least one) from one client address; it closes the others as they come,
//! and it waits a moment when the process is out of descriptors or memory. What a connection
//! carries is hickory's: its length-prefixed messages, idle timeout and response buffer, and
//! the same [`ZoneRequestHandler`] as UDP.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt as _;
use hickory_server::{
    net::{
        runtime::{TokioTime, iocompat::AsyncIoTokioAsStd},
        tcp::TcpStream,
        xfer::Protocol,
    },
    proto::{
        op::{Header, MessageType, Metadata, ResponseCode},
        serialize::binary::{BinDecodable, BinDecoder},
    },
    server::{Request, RequestHandler, ResponseHandle, ResponseHandler, TimeoutStream},
    zone_handler::{MessageResponseBuilder, Queries},
};
use tracing::{debug, warn};

use super::server::ZoneRequestHandler;
use crate::telemetry::WarnLimit;

/// How long a TCP connection may stay idle.
const TCP_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-connection buffer of TCP responses.
const TCP_RESPONSE_BUFFER: usize = 64;
/// The pause after an accept that failed for want of descriptors or memory, instead of trying
/// again at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Default for `--dns-max-tcp-connections`: far more than the CoreDNS instances in front of
/// the agents keep open (they forward over TCP what their clients ask over TCP, and answers
/// truncated over UDP), and small enough that they cost little memory.
pub const DEFAULT_MAX_TCP_CONNECTIONS: u32 = 256;

/// The open connections of every listener of the server, in all and by client address.
#[derive(Clone, Debug)]
pub(super) struct Limits(Arc<Mutex<Open>>);

impl Limits {
    /// At most `max` connections, and `max / 8` (at least one) from one address.
    pub(super) fn new(max: usize) -> Self {
        Limits(Arc::new(Mutex::new(Open::new(max))))
    }
}

/// The open connections, in all and by client address.
#[derive(Debug)]
struct Open {
    max: usize,
    per_client_max: usize,
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// One admitted connection; gives its place back when dropped.
struct Admitted {
    limits: Limits,
    client: IpAddr,
}

impl Open {
    fn new(max: usize) -> Self {
        Open {
            max,
            per_client_max: (max / 8).max(1),
            total: 0,
            by_client: HashMap::new(),
        }
    }
}

impl Limits {
    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for a connection from `client`, or says why there is none.
    fn admit(&self, client: IpAddr) -> Result<Admitted, &'static str> {
        let mut o = self.open();
        let from_client = o.by_client.get(&client).copied().unwrap_or(0);
        if o.total >= o.max {
            return Err("the server's connection limit");
        }
        if from_client >= o.per_client_max {
            return Err("the per-client connection limit");
        }
        o.total += 1;
        *o.by_client.entry(client).or_default() += 1;
        Ok(Admitted {
            limits: self.clone(),
            client,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut o = self.limits.open();
        o.total -= 1;
        if let Some(n) = o.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                o.by_client.remove(&self.client);
            }
        }
    }
}

/// Accepts connections on `listener` and answers their queries with `handler`, within
/// `limits` (shared by the server's listeners), until the runtime stops.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    handler: ZoneRequestHandler,
    limits: Limits,
) {
    let (refusals, failures) = (WarnLimit::default(), WarnLimit::default());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors or memory: trying again at once would spin. Any other
                // failure is one connection's (reset before it was accepted, say).
                let starved = matches!(
                    error.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                if starved && failures.now() {
                    warn!(%error, "DNS: accepting a TCP connection failed; pausing (further failures within 10 minutes are logged at DEBUG)");
                } else {
                    debug!(%error, "DNS: accepting a TCP connection failed");
                }
                if starved {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                continue;
            }
        };
        let admitted = match limits.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(limit) => {
                // Closed at once: the client sees the close rather than a hang.
                drop(stream);
                if refusals.now() {
                    warn!(%peer, limit, "DNS: a TCP connection over the limit was closed (further ones within 10 minutes are logged at DEBUG)");
                } else {
                    debug!(%peer, limit, "DNS: a TCP connection over the limit was closed");
                }
                continue;
            }
        };
        tokio::spawn(connection(stream, peer, handler.clone(), admitted));
    }
}

/// Answers one connection's queries until it closes, fails or idles past [`TCP_TIMEOUT`].
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handler: ZoneRequestHandler,
    _admitted: Admitted,
) {
    let (messages, responses) = TcpStream::from_stream_with_buffer_size(
        AsyncIoTokioAsStd(stream),
        peer,
        TCP_RESPONSE_BUFFER,
    );
    let mut messages = TimeoutStream::new(messages, TCP_TIMEOUT);
    while let Some(message) = messages.next().await {
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                debug!(%peer, %error, "DNS: a TCP connection ended");
                return;
            }
        };
        let (bytes, src) = message.into_parts();
        // Read first, for the FORMERR of a message that does not parse further.
        let header = Header::read(&mut BinDecoder::new(&bytes)).ok();
        let response = ResponseHandle::new(src, responses.clone(), Protocol::Tcp);
        match Request::from_bytes(bytes, src, Protocol::Tcp) {
            // Answered one at a time, as hickory does: a client cannot queue up work.
            Ok(request) if request.metadata.message_type == MessageType::Query => {
                handler
                    .handle_request::<_, TokioTime>(&request, response)
                    .await;
            }
            // Responses are never answered (no reflection).
            Ok(_) => {}
            Err(error) => form_error(header, peer, error, response).await,
        }
    }
}

/// FORMERR for a query whose header parsed but not the rest; nothing for a message too short
/// to have a header, or one that says it is a response (no reflection).
async fn form_error(
    header: Option<Header>,
    peer: SocketAddr,
    error: impl std::fmt::Display,
    mut response: impl ResponseHandler,
) {
    debug!(%peer, %error, "DNS: a malformed message over TCP");
    let Some(header) = header else {
        return;
    };
    if header.metadata.message_type != MessageType::Query {
        return;
    }
    let mut metadata = Metadata::response_from_request(&header.metadata);
    metadata.response_code = ResponseCode::FormErr;
    // No question: it is what did not parse.
    let Ok(queries) = Queries::read(&mut BinDecoder::new(&[]), 0) else {
        return;
    };
    let builder = MessageResponseBuilder::new(&queries, None);
    if let Err(error) = response
        .send_response(builder.build_no_records(metadata))
        .await
    {
        debug!(%peer, %error, "DNS: sending FORMERR failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_capped_in_all_and_per_client_and_given_back() {
        let limits = Limits::new(16);
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let from_a: Vec<Admitted> = (0..2).map(|_| limits.admit(a).unwrap()).collect();
        assert_eq!(
            limits.admit(a).err(),
            Some("the per-client connection limit")
        );
        let others: Vec<Admitted> = (0..14)
            .map(|i| limits.admit(IpAddr::from([10, 0, 1, i])).unwrap())
            .collect();
        assert_eq!(limits.admit(b).err(), Some("the server's connection limit"));
        drop(from_a);
        assert!(
            limits.admit(b).is_ok(),
            "places come back when connections end"
        );
        drop(others);
        let o = limits.open();
        assert_eq!((o.total, o.by_client.len()), (0, 0));
    }
}
