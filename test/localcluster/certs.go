package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// secrets are the key material of one cluster, written as files into its directory.
type secrets struct {
	caCert      string // PEM CA certificate: signs the API server's serving certificate and cluster CSRs
	caKey       string // PEM CA private key (the controller-manager's cluster signing key)
	servingCert string // PEM serving certificate of the API server for 127.0.0.1 and localhost
	servingKey  string
	// frontProxyCert and frontProxyKey are the client certificate the API
	// server's aggregator presents to an aggregated API server (Karmada's
	// serves the clusters), signed by the CA, named frontProxyClientName.
	frontProxyCert string
	frontProxyKey  string
	saKey          string // PEM RSA private key that signs service account tokens
	saPub          string // PEM public key that verifies them
	tokenAuthFile  string // the API server's static token file
	adminToken     string // bearer token of the admin user (group system:masters)
	caCertPEMBytes []byte
}

// adminUser is the user name of the admin token. The group system:masters gives it
// every permission without any RBAC binding.
const adminUser = "localcluster-admin"

// frontProxyClientName is the common name of the aggregator's client
// certificate, the one name an aggregated API server trusts the user headers of.
const frontProxyClientName = "front-proxy-client"

// writeSecrets generates a CA, the API server's serving certificate, the service
// account key pair and a token auth file, and writes them under dir.
func writeSecrets(dir string) (*secrets, error) {
	s := &secrets{
		caCert:         filepath.Join(dir, "ca.crt"),
		caKey:          filepath.Join(dir, "ca.key"),
		servingCert:    filepath.Join(dir, "apiserver.crt"),
		servingKey:     filepath.Join(dir, "apiserver.key"),
		frontProxyCert: filepath.Join(dir, "front-proxy-client.crt"),
		frontProxyKey:  filepath.Join(dir, "front-proxy-client.key"),
		saKey:          filepath.Join(dir, "sa.key"),
		saPub:          filepath.Join(dir, "sa.pub"),
		tokenAuthFile:  filepath.Join(dir, "tokens.csv"),
	}
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "localcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceClusterIP)},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating the API server certificate: %w", err)
	}

	frontProxyKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	frontProxyTemplate := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: frontProxyClientName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	frontProxyDER, err := x509.CreateCertificate(rand.Reader, frontProxyTemplate, caCert, &frontProxyKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating the front proxy client certificate: %w", err)
	}
	frontProxyKeyDER, err := x509.MarshalECPrivateKey(frontProxyKey)
	if err != nil {
		return nil, err
	}

	// Service account tokens: the API server and controller-manager accept RSA keys
	// everywhere, so use RSA here.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}

	caKeyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return nil, err
	}
	servingKeyDER, err := x509.MarshalECPrivateKey(servingKey)
	if err != nil {
		return nil, err
	}

	s.caCertPEMBytes = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	token, err := randomToken()
	if err != nil {
		return nil, err
	}
	s.adminToken = token
	files := []struct {
		path string
		data []byte
	}{
		{s.caCert, s.caCertPEMBytes},
		{s.caKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: caKeyDER})},
		{s.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER})},
		{s.servingKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: servingKeyDER})},
		{s.frontProxyCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: frontProxyDER})},
		{s.frontProxyKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: frontProxyKeyDER})},
		{s.saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})},
		{s.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub})},
		// token,user,uid,"group1,group2"
		{s.tokenAuthFile, fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", token, adminUser, adminUser)},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
