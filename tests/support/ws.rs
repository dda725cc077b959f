//! A WebSocket client for `GET /v1/sessions/{id}/ws` (tokio-tungstenite,
//! the dev-dependency the server's axum WebSocket is tested with).

use reqwest::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

use super::TestApp;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the visitor WebSocket of `session`, with `key` as the bearer token
/// if given. A refused upgrade is `tungstenite::Error::Http` (its status).
pub async fn connect_ws(
    app: &TestApp,
    session: &str,
    key: Option<&str>,
) -> Result<Ws, tungstenite::Error> {
    let url = format!(
        "{}/v1/sessions/{session}/ws",
        app.base.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request()?;
    if let Some(key) = key {
        request
            .headers_mut()
            .insert(AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(ws)
}

/// Opens the visitor WebSocket of `session` at `base` with a token from
/// `POST …/ws-token`; a refused upgrade is its HTTP status.
#[allow(dead_code)]
pub async fn connect_with_token(base: &str, session: &str, token: &str) -> Result<Ws, u16> {
    let url = format!(
        "{}/v1/sessions/{session}/ws?token={token}",
        base.replacen("http://", "ws://", 1)
    );
    match tokio_tungstenite::connect_async(url).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}
