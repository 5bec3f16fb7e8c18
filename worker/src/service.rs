//! The `BatchService` trainers fetch from, and the gRPC server around it
//! (with health checking and reflection so standard tools work).

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use loader_proto::pb::batch_service_server::{BatchService, BatchServiceServer};
use loader_proto::pb::{BatchFrame, FetchRequest};
use loader_process::grpc::{Access, Services};
use loader_process::security::{Role, ServerSecurity, SessionKeys};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{FetchError, WorkerError};
use crate::outbox::{Attachment, Outboxes};

/// Serves each consumer's outbox on `Fetch` streams.
#[derive(Debug, Clone)]
pub(crate) struct FetchService {
    /// The queues streams take batches from.
    outboxes: Arc<Outboxes>,
    /// Checks the session key of each fetch, when tokens are on.
    keys: Option<SessionKeys>,
    /// Cancelled at shutdown, to end the tasks that read credits.
    stop: CancellationToken,
}

impl FetchService {
    /// A service over `outboxes`, stopping its background tasks on `stop`.
    pub(crate) fn new(outboxes: Arc<Outboxes>, keys: Option<SessionKeys>, stop: CancellationToken) -> Self {
        Self { outboxes, keys, stop }
    }
}

type FrameStream = Pin<Box<dyn Stream<Item = Result<BatchFrame, Status>> + Send>>;

#[tonic::async_trait]
impl BatchService for FetchService {
    type FetchStream = FrameStream;

    async fn fetch(&self, request: Request<Streaming<FetchRequest>>) -> Result<Response<FrameStream>, Status> {
        if self.stop.is_cancelled() {
            return Err(FetchError::Closed.into());
        }
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or(FetchError::NoOpening)?;
        if let Some(keys) = &self.keys
            && !keys.verify(first.job_id, first.consumer, first.session_id, &first.session_key)
        {
            return Err(FetchError::WrongSessionKey { job: first.job_id, consumer: first.consumer, session: first.session_id }.into());
        }
        let key = (first.job_id, first.consumer);
        tracing::debug!(job = key.0, consumer = key.1, session = first.session_id, credits = first.credits, "fetch");
        let attachment = Arc::new(self.outboxes.attach(key, first.session_id, first.credits));

        // Credits arrive on the request half; read them until the client
        // goes away, the response stream is dropped, or the worker stops.
        let done = self.stop.child_token();
        let reader = Arc::clone(&attachment);
        let reader_done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = reader_done.cancelled() => break,
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => reader.add_credits(req.credits),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
        });

        // The stream owns the attachment: when tonic drops it (client gone,
        // stream replaced), the outbox is detached and the reader stopped.
        let state = (attachment, done.drop_guard());
        let frames = futures::stream::unfold(state, |(attachment, guard)| async move {
            let frame = Attachment::next(&attachment).await?;
            Some((Ok(frame), (attachment, guard)))
        });
        Ok(Response::new(Box::pin(frames)))
    }
}

/// Serves `BatchService`, health and reflection on `listener` until
/// `stop` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    outboxes: Arc<Outboxes>,
    security: ServerSecurity,
    stop: CancellationToken,
) -> Result<(), WorkerError> {
    // Batches are ~10 MB: no cap on what the worker sends.
    let batches = BatchServiceServer::new(FetchService::new(outboxes, security.session_keys.clone(), stop.clone()))
        .max_encoding_message_size(usize::MAX);
    let services = Services::new(loader_proto::pb::FILE_DESCRIPTOR_SET).serve(Access::Role(Role::Trainer), batches);
    loader_process::grpc::serve(listener, services, &security, stop.cancelled_owned())
        .await
        .map_err(|e| WorkerError::Serve(crate::error::one_line(&e)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use loader_proto::pb::batch_service_client::BatchServiceClient;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;

    /// Every test bounds its own time.
    const LIMIT: Duration = Duration::from_secs(20);

    async fn open(
        client: &mut BatchServiceClient<tonic::transport::Channel>,
        session: u64,
        credits: u32,
    ) -> (mpsc::Sender<FetchRequest>, Streaming<BatchFrame>) {
        let (tx, rx) = mpsc::channel(4);
        tx.send(FetchRequest { job_id: 3, consumer: 1, session_id: session, credits, ..Default::default() })
            .await
            .expect("send opening");
        let stream = client.fetch(ReceiverStream::new(rx)).await.expect("fetch").into_inner();
        (tx, stream)
    }

    async fn frame(stream: &mut Streaming<BatchFrame>) -> Option<Bytes> {
        stream.message().await.expect("frame").map(|f| f.data)
    }

    #[tokio::test]
    async fn fetch_streams_follow_credits_and_replacement() {
        tokio::time::timeout(LIMIT, async {
            let outboxes = Outboxes::new();
            for seq in 0..6u64 {
                outboxes.push((3, 1), seq, Bytes::from(vec![seq as u8; 1 << 20]), 1, tracing::Span::none());
            }
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let stop = CancellationToken::new();
            let server = tokio::spawn(serve(listener, Arc::clone(&outboxes), ServerSecurity::none(), stop.clone()));
            let mut client = BatchServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect")
                .max_decoding_message_size(usize::MAX);

            let (tx, mut first) = open(&mut client, 1, 2).await;
            assert_eq!(frame(&mut first).await, Some(Bytes::from(vec![0u8; 1 << 20])));
            assert_eq!(frame(&mut first).await.map(|b| b[0]), Some(1));
            // Two credits, two batches handed over; the rest wait.
            let delivered: Vec<u64> = outboxes.take_delivered().into_iter().flat_map(|d| d.seqs).collect();
            assert_eq!(delivered, vec![0, 1]);
            tx.send(FetchRequest { credits: 1, ..Default::default() }).await.expect("credit");
            assert_eq!(frame(&mut first).await.map(|b| b[0]), Some(2));

            // A newer stream of the same consumer takes over the rest; the
            // old one ends.
            let (_tx2, mut second) = open(&mut client, 2, 10).await;
            assert_eq!(frame(&mut first).await, None);
            for seq in 3..6u8 {
                assert_eq!(frame(&mut second).await.map(|b| b[0]), Some(seq));
            }
            assert!(outboxes.is_empty());

            // Shutdown ends open streams and the server.
            outboxes.close();
            stop.cancel();
            assert_eq!(frame(&mut second).await, None);
            server.await.expect("join").expect("serve");
        })
        .await
        .expect("test overran its time limit");
    }
}
