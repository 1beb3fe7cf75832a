//! Limits and tracing on the wire: message size caps and W3C trace context.

use antler_integration_tests::{Launch, start};
use antler_proto::runs::{GetRunRequest, run_service_client::RunServiceClient};
use tonic::Code;

#[tokio::test]
async fn oversized_messages_are_refused_with_the_limit() -> anyhow::Result<()> {
    let process = start("antler", Launch::new(["up"]).config("server:\n  max_message_bytes: 2048\n"))?;
    let request = GetRunRequest { run_id: "x".repeat(8 * 1024), ..GetRunRequest::default() };
    let status = match RunServiceClient::new(process.channel().await?).get_run(request).await {
        Ok(_) => anyhow::bail!("an 8 KiB request passed a 2 KiB limit"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("2048"), "{}", status.message());
    Ok(())
}

/// Bytes that are no protobuf message of the method's type are the client's error: INVALID_ARGUMENT
/// with a hint, not INTERNAL (tonic's default), for unary and server-streaming methods alike.
#[tokio::test]
async fn malformed_protobuf_is_invalid_argument() -> anyhow::Result<()> {
    /// Sends and receives bytes as they are.
    #[derive(Debug, Clone, Default)]
    struct Raw;
    impl tonic::codec::Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }
    impl tonic::codec::Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
            bytes::BufMut::put_slice(dst, &item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
            let n = bytes::Buf::remaining(src);
            Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
        }
    }

    let process = start("antler", Launch::new(["up"]))?;
    // 0x0f: field 1 with wire type 7, which protobuf does not have.
    for method in ["/antler.runs.v1.RunService/GetRun", "/antler.runs.v1.RunService/StreamRun"] {
        let mut grpc = tonic::client::Grpc::new(process.channel().await?);
        grpc.ready().await?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
        let status = if method.ends_with("StreamRun") {
            match grpc.server_streaming(tonic::Request::new(vec![0x0f_u8, 0x00]), path, Raw).await {
                Ok(mut stream) => match stream.get_mut().message().await {
                    Err(status) => status,
                    Ok(message) => anyhow::bail!("{method}: malformed bytes were accepted: {message:?}"),
                },
                Err(status) => status,
            }
        } else {
            match grpc.unary(tonic::Request::new(vec![0x0f_u8, 0x00]), path, Raw).await {
                Ok(reply) => anyhow::bail!("{method}: malformed bytes were accepted: {:?}", reply.get_ref()),
                Err(status) => status,
            }
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        assert!(status.message().contains("not a valid protobuf message") && status.message().contains("hint:"), "{status:?}");
    }
    Ok(())
}

#[tokio::test]
async fn the_callers_trace_id_appears_in_the_request_span() -> anyhow::Result<()> {
    let process = start(
        "antler",
        Launch::new(["up"]).config("server:\n  log:\n    filter: antler_kit=debug\n  auth:\n    enabled: true\n    api_keys:\n      - key: trace-test-key-0123456789\n        user: t\n"),
    )?;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(GetRunRequest::default());
    request.metadata_mut().insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").parse()?);
    let status = RunServiceClient::new(process.channel().await?).get_run(request).await.err();
    assert_eq!(status.map(|s| s.code()), Some(Code::Unauthenticated));
    // The refusal is logged inside the request's span, which carries the caller's trace id.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let logs = process.stderr();
        if logs.contains("request refused by authentication") && logs.lines().any(|l| l.contains("request refused") && l.contains(trace_id))
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("no log line with trace id {trace_id}:\n{logs}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
