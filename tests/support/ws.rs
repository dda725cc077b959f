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
