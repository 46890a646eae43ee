//! Image preparations on the engine: the plugin's `prepare_image` runs on the scheduler's
//! thread, between decode steps, like every other call into the model instance; the request's
//! thread waits for the answers.

use std::sync::mpsc;

use crate::image::RgbImage;
use crate::models::LoadedModel;
use berth_plugin_api::{PluginError, PreparedImage, RgbView};

/// One answer per image, in order.
pub type Answers = Vec<Result<PreparedImage, PluginError>>;

/// One request's decoded images, each with its number among the request's images, and where
/// the answers go.
pub struct PrepareJob {
    images: Vec<(RgbImage, u32)>,
    reply: mpsc::Sender<Answers>,
}

impl PrepareJob {
    /// A job for `images` and the channel its answers come back on.
    pub fn new(images: Vec<(RgbImage, u32)>) -> (PrepareJob, mpsc::Receiver<Answers>) {
        let (reply, rx) = mpsc::channel();
        (PrepareJob { images, reply }, rx)
    }

    /// Sends the answers (the request may have gone meanwhile).
    pub fn reply(self, answers: Answers) {
        let _ = self.reply.send(answers);
    }
}

/// Has the model prepare each image of `job`.
pub fn answer(model: &mut LoadedModel, job: &PrepareJob) -> Answers {
    job.images
        .iter()
        .map(|(img, index)| {
            let view = RgbView {
                width: u32::try_from(img.width)
                    .map_err(|_| PluginError::invalid_argument("image too wide"))?,
                height: u32::try_from(img.height)
                    .map_err(|_| PluginError::invalid_argument("image too tall"))?,
                data: &img.data,
            };
            model.instance()?.prepare_image(&view, *index)
        })
        .collect()
}
