// kstatus prints Flux's (and kpt's) verdict on one Kubernetes object, computed by the status
// library of sigs.k8s.io/cli-utils: the object is read as JSON on standard input, and one line
// "<status> <message>" is written, e.g. "Current Resource is current".
//
// The tests use it to check the PeragoTask's conditions the way a real GitOps client reads them.
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading standard input: %v\n", err)
		os.Exit(2)
	}
	// Unstructured's own decoder keeps integers as int64, as the library expects.
	object := &unstructured.Unstructured{}
	if err := object.UnmarshalJSON(input); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: the input is not a Kubernetes object: %v\n", err)
		os.Exit(2)
	}
	result, err := status.Compute(object)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", result.Status, result.Message)
}
