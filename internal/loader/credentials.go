package loader

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/aiinference/operator/internal/loadspec"
)

// credentials are the secrets a source may need. They come from the environment or
// from files named like the variables in a mounted Secret, never from flags (which
// show in `ps` and in the pod spec).
type credentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
	HTTPToken                                  string
	HFToken                                    string
}

// loadCredentials reads each credential from the environment, else from dir/NAME.
func loadCredentials(dir string, getenv func(string) string) (credentials, error) {
	read := func(name string) (string, error) {
		if v := getenv(name); v != "" {
			return v, nil
		}
		if dir == "" {
			return "", nil
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", failf(loadspec.ReasonInvalidConfig, "", "credentials file: %v", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	var c credentials
	var err error
	for _, f := range []struct {
		dst  *string
		name string
	}{
		{&c.AccessKeyID, loadspec.EnvAccessKeyID},
		{&c.SecretAccessKey, loadspec.EnvSecretAccessKey},
		{&c.SessionToken, loadspec.EnvSessionToken},
		{&c.HTTPToken, loadspec.EnvHTTPBearerToken},
		{&c.HFToken, loadspec.EnvHFToken},
	} {
		if *f.dst, err = read(f.name); err != nil {
			return credentials{}, err
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return credentials{}, failf(loadspec.ReasonInvalidConfig, "",
			"only one of %s and %s is set; give both or neither", loadspec.EnvAccessKeyID, loadspec.EnvSecretAccessKey)
	}
	return c, nil
}
