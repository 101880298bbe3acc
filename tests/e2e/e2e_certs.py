"""Certificates and the admin kubeconfig for the loopback test control plane.

Elliptic-curve keys (fast to make) signed by a throwaway CA: the apiserver's serving certificate for
127.0.0.1 and its in-cluster names, an admin client certificate in group system:masters, and the
service-account signing key pair.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _cert(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: list[x509.ObjectIdentifier] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path, *, extra_ips: tuple[str, ...] = ()) -> dict[str, Path]:
    """CA, apiserver serving cert (127.0.0.1, `extra_ips` and the in-cluster names), admin client
    cert, SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        name: directory / name
        for name in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt", "admin.key")
    }
    paths |= {"sa.key": directory / "sa.key", "sa.pub": directory / "sa.pub"}
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "omni-e2e-ca")])
    ca = _cert(subject=ca_name, key=ca_key, issuer=None, ca=True)
    server_key = _key()
    server = _cert(
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        key=server_key,
        issuer=(ca_name, ca_key),
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
            *(
                x509.DNSName(n)
                for n in (
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ),
        ],
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
    )
    admin_key = _key()
    admin = _cert(
        subject=x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "omni-e2e-admin"),
            ]
        ),
        key=admin_key,
        issuer=(ca_name, ca_key),
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    for name, cert, key in (
        ("ca", ca, ca_key),
        ("apiserver", server, server_key),
        ("admin", admin, admin_key),
    ):
        paths[f"{name}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(paths[f"{name}.key"], key)
    sa_key = _key()
    _write_key(paths["sa.key"], sa_key)
    paths["sa.pub"].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return paths


def write_kubeconfig(path: Path, *, server: str, certs: dict[str, Path]) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "omni-e2e", "cluster": {"server": server, "certificate-authority": str(certs["ca.crt"])}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(certs["admin.crt"]),
                    "client-key": str(certs["admin.key"]),
                },
            }
        ],
        "contexts": [{"name": "omni-e2e", "context": {"cluster": "omni-e2e", "user": "admin"}}],
        "current-context": "omni-e2e",
    }
    path.write_text(yaml.safe_dump(config))
