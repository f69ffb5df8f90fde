//! A TCP proxy on 127.0.0.1 that can be cut: the test's stand-in for a pod losing its network
//! (SIGKILL or a partition), where nothing it holds is released.

use std::net::SocketAddr;

use anyhow::Context as _;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// Forwards every connection to `target` until [`cut`](Self::cut), except while
/// [`blocked`](Self::block).
pub struct TcpProxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    blocked: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let (cut, rx) = watch::channel(false);
        let (blocked, blocked_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut stop = rx.clone();
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stop.wait_for(|c| *c) => return, // drops the listener: refused from now on
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                if *blocked_rx.borrow() {
                    continue; // dropped: the connection dies at once
                }
                let (mut stop, mut block) = (rx.clone(), blocked_rx.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = stop.wait_for(|c| *c) => {} // both ends are dropped: the connection dies
                        _ = block.wait_for(|b| *b) => {}
                    }
                });
            }
        });
        Ok(Self {
            addr,
            cut,
            blocked,
            task,
        })
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client that talks through the proxy.
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().expect("a valid URI");
        kube::Client::try_from(kube::Config::new(url)).expect("a plain-HTTP kube client builds")
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    /// A partition while `blocked`: every connection is cut and new ones are dropped; then
    /// connections go through again.
    pub fn block(&self, blocked: bool) {
        let _ = self.blocked.send(blocked);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
