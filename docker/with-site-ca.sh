#!/bin/sh
# with-site-ca COMMAND [ARGS...]
# Runs COMMAND trusting the CA bundle of the build secret `site_ca` when one was passed
# (`--secret id=site_ca,src=FILE`), for sites whose proxy re-signs TLS; otherwise runs it
# unchanged. The bundle is mounted for the one RUN step only and never enters a layer.
set -eu
ca=/run/secrets/site_ca
if [ -s "$ca" ]; then
    export SSL_CERT_FILE="$ca" PIP_CERT="$ca" REQUESTS_CA_BUNDLE="$ca" \
        CURL_CA_BUNDLE="$ca" GIT_SSL_CAINFO="$ca"
fi
exec "$@"
