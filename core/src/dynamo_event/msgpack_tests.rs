//! Tests of the bounded msgpack reader and the rmp-serde-compatible writer.

use super::msgpack::{
    Container, MAX_DEPTH, MsgpackError, Reader, write_array_len, write_bin, write_map_len,
    write_str, write_u64,
};

#[test]
fn integers_in_every_form() {
    let cases: &[(&[u8], Result<u64, MsgpackError>)] = &[
        (&[0x00], Ok(0)),
        (&[0x7f], Ok(127)),
        (&[0xcc, 0xff], Ok(255)),
        (&[0xcd, 0x01, 0x00], Ok(256)),
        (&[0xce, 0, 1, 0, 0], Ok(65_536)),
        (
            &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            Ok(u64::MAX),
        ),
        (&[0xd0, 0x05], Ok(5)),
        (&[0xd3, 0, 0, 0, 0, 0, 0, 0, 9], Ok(9)),
        (&[0xd0, 0xff], Err(MsgpackError::OutOfRange)),
        (
            &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
            Err(MsgpackError::OutOfRange),
        ),
        (&[0xff], Err(MsgpackError::OutOfRange)),
        (&[0xcf, 0, 0], Err(MsgpackError::Truncated)),
        (&[], Err(MsgpackError::Truncated)),
        (&[0xc0], Err(MsgpackError::UnexpectedType(0xc0))),
        (&[0xa1, b'1'], Err(MsgpackError::UnexpectedType(0xa1))),
    ];
    for (bytes, want) in cases {
        assert_eq!(Reader::new(bytes).u64(), *want, "{bytes:02x?}");
    }
    assert_eq!(Reader::new(&[0xc0]).opt_u64(), Ok(None));
    assert_eq!(Reader::new(&[0x03]).opt_u64(), Ok(Some(3)));
}

#[test]
fn declared_lengths_are_checked_before_use() {
    // str32 / bin32 / array32 / map32 declaring 4 GiB in a few bytes
    assert_eq!(
        Reader::new(&[0xdb, 0xff, 0xff, 0xff, 0xff]).str(),
        Err(MsgpackError::Truncated)
    );
    assert_eq!(
        Reader::new(&[0xc6, 0xff, 0xff, 0xff, 0xff]).bin(),
        Err(MsgpackError::Truncated)
    );
    assert_eq!(
        Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0]).container(),
        Err(MsgpackError::Truncated)
    );
    assert_eq!(
        Reader::new(&[0xdf, 0, 0, 0, 1, 0]).container(),
        Err(MsgpackError::Truncated)
    );
    assert_eq!(
        Reader::new(&[0xdf, 0, 0, 0, 1, 0, 0]).container(),
        Ok(Container::Map(1))
    );
    assert_eq!(Reader::new(&[0xc4, 2, 1, 2]).bin(), Ok(&[1u8, 2][..]));
    assert_eq!(Reader::new(&[0xd9, 1, b'x']).str(), Ok(&b"x"[..]));
}

#[test]
fn skip_every_type_and_bound_depth() {
    let values: &[&[u8]] = &[
        &[0xc0],
        &[0xc2],
        &[0xe5],
        &[0xca, 0, 0, 0, 0],
        &[0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xa2, b'h', b'i'],
        &[0xc5, 0, 1, 7],
        &[0xd4, 1, 2],
        &[0xd8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xc7, 2, 5, 1, 2],
        &[0x92, 0x01, 0x81, 0xa1, b'k', 0x90],
        &[0xde, 0, 1, 0x01, 0x02],
    ];
    for v in values {
        let mut bytes = v.to_vec();
        bytes.push(0x2a);
        let mut r = Reader::new(&bytes);
        assert_eq!(r.skip(), Ok(()), "{v:02x?}");
        assert_eq!(r.u64(), Ok(42), "{v:02x?} skipped exactly");
    }
    assert_eq!(Reader::new(&[0xc1]).skip(), Err(MsgpackError::Reserved));
    assert_eq!(
        Reader::new(&[0xc7, 9, 1]).skip(),
        Err(MsgpackError::Truncated)
    );
    let ok = [vec![0x91; MAX_DEPTH], vec![0xc0]].concat();
    assert_eq!(Reader::new(&ok).skip(), Ok(()));
    let deep = [vec![0x91; MAX_DEPTH + 1], vec![0xc0]].concat();
    assert_eq!(Reader::new(&deep).skip(), Err(MsgpackError::TooDeep));
    // a long flat array is skipped without recursion
    let mut flat = vec![0xdc, 0xff, 0xff];
    flat.resize(3 + 0xffff, 0x00);
    assert_eq!(Reader::new(&flat).skip(), Ok(()));
}

#[test]
fn writer_uses_the_smallest_forms() {
    let w = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = Vec::new();
        f(&mut v);
        v
    };
    assert_eq!(w(&|o| write_u64(o, 127)), [0x7f]);
    assert_eq!(w(&|o| write_u64(o, 128)), [0xcc, 0x80]);
    assert_eq!(w(&|o| write_u64(o, 65_535)), [0xcd, 0xff, 0xff]);
    assert_eq!(w(&|o| write_u64(o, 65_536)), [0xce, 0, 1, 0, 0]);
    assert_eq!(
        w(&|o| write_u64(o, 1 << 32)),
        [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]
    );
    assert_eq!(w(&|o| write_str(o, &[b'a'; 31]))[0], 0xbf);
    assert_eq!(w(&|o| write_str(o, &[b'a'; 32]))[..2], [0xd9, 32]);
    assert_eq!(w(&|o| write_str(o, &[b'a'; 256]))[..3], [0xda, 1, 0]);
    assert_eq!(w(&|o| write_bin(o, &[]))[..], [0xc4, 0]);
    assert_eq!(w(&|o| write_bin(o, &[0; 256]))[..3], [0xc5, 1, 0]);
    assert_eq!(w(&|o| write_bin(o, &[0; 65_536]))[..5], [0xc6, 0, 1, 0, 0]);
    assert_eq!(w(&|o| write_map_len(o, 15)), [0x8f]);
    assert_eq!(w(&|o| write_map_len(o, 16)), [0xde, 0, 16]);
    assert_eq!(w(&|o| write_array_len(o, 5)), [0x95]);
    assert_eq!(w(&|o| write_array_len(o, 70_000)), [0xdd, 0, 1, 0x11, 0x70]);
}
