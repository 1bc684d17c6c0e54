//! Shape and error-message tests of `conv`.

use super::*;

fn p(stride: usize, pad: Padding, dil: usize, groups: usize) -> ConvParams {
    ConvParams {
        stride: vec![stride],
        padding: pad,
        dilation: vec![dil],
        groups,
    }
}

#[test]
fn shapes() {
    let s = |i: &[usize], w: &[usize], pr: &ConvParams| {
        conv_shape("conv2d", i, w, None, pr).unwrap().to_vec()
    };
    assert_eq!(
        s(
            &[8, 64, 56, 56],
            &[64, 64, 3, 3],
            &p(1, Padding::Explicit(vec![1]), 1, 1)
        ),
        [8, 64, 56, 56]
    );
    assert_eq!(
        s(&[2, 4, 9, 9], &[6, 2, 3, 3], &p(2, Padding::Valid, 1, 2)),
        [2, 6, 4, 4]
    );
    assert_eq!(
        s(&[2, 4, 9, 8], &[4, 1, 4, 2], &p(1, Padding::Same, 2, 4)),
        [2, 4, 9, 8]
    );
    assert_eq!(
        s(&[4, 9, 9], &[6, 4, 3, 3], &p(1, Padding::Valid, 2, 1)),
        [6, 5, 5]
    );
    let c1 = conv_shape(
        "conv1d",
        &[2, 3, 10],
        &[5, 3, 4],
        Some(&[5]),
        &p(3, Padding::Explicit(vec![2]), 1, 1),
    );
    assert_eq!(c1.unwrap().as_slice(), &[2, 5, 4]);
    let g = conv_geometry(
        "conv2d",
        &[1, 1, 5, 5],
        &[1, 1, 4, 4],
        None,
        &p(1, Padding::Same, 1, 1),
    )
    .unwrap();
    assert_eq!((g.pad_begin, g.pad_end), ([1, 1], [2, 2]));
    let g = conv_geometry(
        "conv1d",
        &[1, 1, 5],
        &[1, 1, 4],
        None,
        &p(1, Padding::Same, 3, 1),
    )
    .unwrap();
    assert_eq!(
        (g.pad_begin, g.pad_end, g.out_size),
        ([0, 4], [0, 5], [1, 5])
    );
    let pr = ConvParams {
        stride: vec![2, 1],
        padding: Padding::Explicit(vec![1, 0]),
        ..Default::default()
    };
    assert_eq!(s(&[1, 1, 7, 7], &[1, 1, 3, 3], &pr), [1, 1, 4, 5]);
}

#[test]
fn errors() {
    let e = |i: &[usize], w: &[usize], b: Option<&[usize]>, pr: &ConvParams| {
        conv_shape("conv2d", i, w, b, pr).unwrap_err().to_string()
    };
    assert_eq!(
        e(&[2, 3, 8, 8], &[4, 2, 3, 3], None, &ConvParams::default()),
        "conv2d: input [2,3,8,8] has 3 channels but weight [4,2,3,3] with groups=1 expects 2"
    );
    assert_eq!(
        e(
            &[2, 4, 8, 8],
            &[4, 1, 3, 3],
            None,
            &p(1, Padding::Valid, 1, 2)
        ),
        "conv2d: input [2,4,8,8] has 4 channels but weight [4,1,3,3] with groups=2 expects 2"
    );
    assert_eq!(
        e(
            &[2, 4, 8, 8],
            &[5, 2, 3, 3],
            None,
            &p(1, Padding::Valid, 1, 2)
        ),
        "conv2d: weight [5,2,3,3]: out_channels 5 is not divisible by groups=2"
    );
    assert_eq!(
        e(
            &[2, 2, 8, 8],
            &[4, 2, 3, 3],
            Some(&[3]),
            &ConvParams::default()
        ),
        "conv2d: bias [3] does not match out_channels 4 of weight [4,2,3,3]"
    );
    assert_eq!(
        e(&[2, 2, 2, 2], &[4, 2, 3, 3], None, &ConvParams::default()),
        "conv2d: input [2,2,2,2] with padding [0,0] is too small for weight [4,2,3,3] (dilation [1,1]): output size would be [0,0]"
    );
    assert_eq!(
        e(
            &[2, 2, 8, 8],
            &[4, 2, 3, 3],
            None,
            &p(2, Padding::Same, 1, 1)
        ),
        "conv2d: padding='same' requires stride 1, got stride [2,2]"
    );
    assert_eq!(
        e(&[2, 8, 8], &[4, 2, 3], None, &ConvParams::default()),
        "conv2d: weight [4,2,3] must be 4-D [out_channels, in_channels/groups, kH, kW]"
    );
    assert_eq!(
        e(&[8, 8], &[4, 2, 3, 3], None, &ConvParams::default()),
        "conv2d: input [8,8] must be 3-D (unbatched) or 4-D (batched) for weight [4,2,3,3]"
    );
    assert_eq!(
        e(
            &[1, 2, 8, 8],
            &[4, 2, 3, 3],
            None,
            &p(0, Padding::Valid, 1, 1)
        ),
        "conv2d: stride [0,0] must be positive"
    );
}

#[test]
fn transpose() {
    let pr = ConvTransposeParams {
        stride: vec![2],
        padding: vec![1],
        output_padding: vec![1],
        dilation: vec![1],
        groups: 2,
    };
    let s = conv_transpose2d_shape(&[2, 4, 5, 6], &[4, 3, 3, 3], Some(&[6]), &pr).unwrap();
    assert_eq!(s.as_slice(), &[2, 6, 10, 12]);
    let bad = ConvTransposeParams {
        output_padding: vec![2],
        ..pr.clone()
    };
    let e = conv_transpose2d_shape(&[2, 4, 5, 6], &[4, 3, 3, 3], None, &bad).unwrap_err();
    assert_eq!(
        e.to_string(),
        "conv_transpose2d: output_padding [2,2] must be smaller than either stride [2,2] or dilation [1,1]"
    );
    let e = conv_transpose2d_shape(&[2, 3, 5, 6], &[4, 3, 3, 3], None, &pr).unwrap_err();
    assert!(e.to_string().starts_with(
        "conv_transpose2d: input [2,3,5,6] has 3 channels but weight [4,3,3,3] expects 4"
    ));
}
