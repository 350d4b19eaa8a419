// Package socialnet holds the SocialNetwork's Go functions' entry points
// for Staccato: each manifest entry names one of these as its handler.
// They only hand the call to the service in package sn, which the RPC
// servers of cmd/rpcserver host unchanged.
package socialnet

import (
	"staccato.local/go/staccato"
	"staccato.local/socialnet/sn"
)

func ComposePost(ctx *staccato.Context, in []byte) ([]byte, error)  { return sn.ComposePost(ctx, in) }
func URLShorten(ctx *staccato.Context, in []byte) ([]byte, error)   { return sn.URLShorten(ctx, in) }
func UserMention(ctx *staccato.Context, in []byte) ([]byte, error)  { return sn.UserMention(ctx, in) }
func User(ctx *staccato.Context, in []byte) ([]byte, error)         { return sn.User(ctx, in) }
func UniqueID(ctx *staccato.Context, in []byte) ([]byte, error)     { return sn.UniqueID(ctx, in) }
func PostStorage(ctx *staccato.Context, in []byte) ([]byte, error)  { return sn.PostStorage(ctx, in) }
func UserTimeline(ctx *staccato.Context, in []byte) ([]byte, error) { return sn.UserTimeline(ctx, in) }
func HomeTimeline(ctx *staccato.Context, in []byte) ([]byte, error) { return sn.HomeTimeline(ctx, in) }
func SocialGraph(ctx *staccato.Context, in []byte) ([]byte, error)  { return sn.SocialGraph(ctx, in) }

func PostComposeAPI(ctx *staccato.Context, in []byte) ([]byte, error) {
	return sn.PostComposeAPI(ctx, in)
}
func HomeTimelineReadAPI(ctx *staccato.Context, in []byte) ([]byte, error) {
	return sn.HomeTimelineReadAPI(ctx, in)
}
func UserTimelineReadAPI(ctx *staccato.Context, in []byte) ([]byte, error) {
	return sn.UserTimelineReadAPI(ctx, in)
}
func UserFollowAPI(ctx *staccato.Context, in []byte) ([]byte, error) {
	return sn.UserFollowAPI(ctx, in)
}
func UserRegisterAPI(ctx *staccato.Context, in []byte) ([]byte, error) {
	return sn.UserRegisterAPI(ctx, in)
}
func UserLoginAPI(ctx *staccato.Context, in []byte) ([]byte, error) { return sn.UserLoginAPI(ctx, in) }
