//! A cloneable "stop now" signal for long-lived tasks.

use tokio::sync::watch;

/// Held by the owner; `trigger` tells every [`Shutdown`] to stop.
#[derive(Clone, Debug)]
pub struct ShutdownTrigger(std::sync::Arc<watch::Sender<bool>>);

/// Held by a task; `wait` resolves once shutdown was triggered (or the trigger dropped).
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(std::sync::Arc::new(tx)), Shutdown(rx))
}

impl ShutdownTrigger {
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Shutdown {
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }
}
