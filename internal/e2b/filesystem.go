package e2b

import (
	"context"
	"errors"
	"path"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gatehouse/gatehouse/internal/agentd"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/filesystem"
	"github.com/gatehouse/gatehouse/internal/e2b/gen/filesystem/filesystemconnect"
)

// filesystemService is envd's filesystem service over the gateway. Only
// Stat has an audited agentd operation behind it; the others answer
// unimplemented (see docs/e2b-endpoint.md) rather than reach the sandbox
// some unaudited way.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	c := callOf(ctx)
	if req.Msg.GetPath() == "" {
		return nil, refuse(connect.CodeInvalidArgument, "Give the path to describe.")
	}
	res, err := f.s.Gateway.Stat(ctx, c.Org, c.Actor, c.meta, c.SessionID, []string{req.Msg.GetPath()})
	if err != nil {
		return nil, err
	}
	if len(res) != 1 || !res[0].Exists {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("No file or directory at "+req.Msg.GetPath()+"."))
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(res[0])}), nil
}

func entryInfo(st agentd.FileStat) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{Name: path.Base(st.Path), Path: st.Path, Size: st.Size, Permissions: st.Mode}
	switch st.Type {
	case "file":
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
	}
	if m, err := strconv.ParseUint(st.Mode, 8, 32); err == nil {
		e.Mode = uint32(m)
	}
	if st.MTime != nil {
		e.ModifiedTime = timestamppb.New(*st.MTime)
	}
	return e
}

// unimplemented answers a filesystem call with no audited operation
// behind it.
func unimplemented(what string) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New(what+" is not offered by this console's E2B-compatible endpoint: "+
		"it has no audited operation for it. Run a command instead (commands.run), which is authorized, audited and recorded."))
}

func (f *filesystemService) ListDir(context.Context, *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	return nil, unimplemented("Listing a directory (files.list)")
}

func (f *filesystemService) MakeDir(context.Context, *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	return nil, unimplemented("Making a directory (files.makeDir)")
}

func (f *filesystemService) Move(context.Context, *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	return nil, unimplemented("Moving a file (files.rename)")
}

func (f *filesystemService) Remove(context.Context, *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	return nil, unimplemented("Removing a file (files.remove)")
}

func (f *filesystemService) WatchDir(context.Context, *connect.Request[filesystem.WatchDirRequest], *connect.ServerStream[filesystem.WatchDirResponse]) error {
	return unimplemented("Watching a directory (files.watchDir)")
}

func (f *filesystemService) CreateWatcher(context.Context, *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return nil, unimplemented("Watching a directory (files.watchDir)")
}

func (f *filesystemService) GetWatcherEvents(context.Context, *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return nil, unimplemented("Watching a directory (files.watchDir)")
}

func (f *filesystemService) RemoveWatcher(context.Context, *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return nil, unimplemented("Watching a directory (files.watchDir)")
}
