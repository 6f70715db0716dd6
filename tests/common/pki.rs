//! A test PKI made with rcgen: a CA ([`TestCa`]) and certificates it issues, written as PEM
//! files (the etcd TLS tests and the `https://` backend tests).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority whose certificate is written to `<dir>/<stem>.pem`.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
    /// The CA certificate's PEM file.
    pub pem: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("pem", &self.pem).finish()
    }
}

/// An issued certificate's PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn write(dir: &Path, name: &str, pem: String) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

impl TestCa {
    /// A new CA named `common_name`, written to `<dir>/<stem>.pem`.
    pub fn new(dir: &Path, stem: &str, common_name: &str) -> TestCa {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, common_name.to_owned());
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = ca.self_signed(&key).expect("self-sign CA");
        let pem = write(dir, &format!("{stem}.pem"), cert.pem());
        TestCa { cert, key, pem }
    }

    /// A certificate for `sans` (DNS names or IP literals) with these extended key usages,
    /// written to `<dir>/<stem>.pem` and `<dir>/<stem>-key.pem`.
    pub fn issue(
        &self,
        dir: &Path,
        stem: &str,
        common_name: &str,
        sans: &[&str],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Issued {
        let mut p =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("certificate params");
        p.distinguished_name
            .push(DnType::CommonName, common_name.to_owned());
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = usages.to_vec();
        let key = KeyPair::generate().expect("key");
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign certificate");
        Issued {
            cert: write(dir, &format!("{stem}.pem"), cert.pem()),
            key: write(dir, &format!("{stem}-key.pem"), key.serialize_pem()),
        }
    }

    /// A TLS server certificate for `sans`.
    pub fn server(&self, dir: &Path, stem: &str, sans: &[&str]) -> Issued {
        self.issue(
            dir,
            stem,
            stem,
            sans,
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )
    }
}
