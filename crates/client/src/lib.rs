//! gapless client (being written).
