"""The files a test's own kube-apiserver needs: a serving certificate for 127.0.0.1, a
service-account key, a static token in the group system:masters and a kubeconfig with it."""

import secrets
import subprocess


def write(work, port, name):
    """Writes serving.crt/serving.key, sa.key, tokens.csv and kubeconfig into `work` for a
    kube-apiserver on 127.0.0.1:`port`; returns the token (user NAME-admin)."""
    for argv in (
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", f"{work}/serving.key", "-out", f"{work}/serving.crt"],
        ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{work}/sa.key"],
    ):
        subprocess.run(argv, check=True, capture_output=True)
    token = secrets.token_hex(16)
    with open(f"{work}/tokens.csv", "w") as f:
        f.write(f"{token},{name}-admin,{name}-admin,system:masters\n")
    with open(f"{work}/kubeconfig", "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster: {{server: "https://127.0.0.1:{port}", certificate-authority: "{work}/serving.crt"}}
users:
- name: admin
  user: {{token: "{token}"}}
contexts:
- name: {name}
  context: {{cluster: {name}, user: admin}}
current-context: {name}
""")
    return token
