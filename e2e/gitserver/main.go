// gitserver serves the bare Git repositories under a directory over Git's smart HTTP protocol,
// read-only, for Flux's source-controller in the e2e tests: every request runs the machine's
// `git http-backend` as a CGI program (Go's net/http/cgi), so what answers is Git's own server.
//
//	gitserver --listen 127.0.0.1:PORT --root DIR
//
// A repository DIR/NAME.git is cloned as http://127.0.0.1:PORT/NAME.git. The tests commit to a
// working copy and push to the bare repository by its path; nothing is pushed over HTTP.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address to serve on")
	root := flag.String("root", "", "the directory holding the bare repositories")
	flag.Parse()
	if *root == "" {
		fmt.Fprintln(os.Stderr, "gitserver: --root is required")
		os.Exit(2)
	}
	dir, err := filepath.Abs(*root)
	if err != nil {
		log.Fatalf("gitserver: %v", err)
	}
	git, err := exec.LookPath("git")
	if err != nil {
		log.Fatalf("gitserver: git is not on PATH: %v", err)
	}
	out, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		log.Fatalf("gitserver: git --exec-path: %v", err)
	}
	backend := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Env: []string{
			"GIT_PROJECT_ROOT=" + dir,
			// Every repository under the root is served, without a git-daemon-export-ok file.
			"GIT_HTTP_EXPORT_ALL=1",
		},
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("gitserver: %v", err)
	}
	log.Printf("gitserver: serving %s on http://%s", dir, listener.Addr())
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read-only: a push (git-receive-pack) is refused before Git sees it.
		if strings.HasSuffix(r.URL.Path, "/git-receive-pack") ||
			r.URL.Query().Get("service") == "git-receive-pack" {
			http.Error(w, "this server is read-only", http.StatusForbidden)
			return
		}
		log.Printf("%s %s", r.Method, r.URL.RequestURI())
		backend.ServeHTTP(w, r)
	})
	log.Fatal(http.Serve(listener, handler))
}
