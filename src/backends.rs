//! Backend switches, as `torch.backends`: [`cpu`] chooses and remembers the
//! convolution algorithm per shape (`cudnn.benchmark`'s analogue).

pub mod cpu;
